//! Device rules on cgroup v2: the `devices.allow` lines of a workload ([`crate::isolation::
//! gpu_device_rules`]) compiled into a BPF program of type `BPF_PROG_TYPE_CGROUP_DEVICE` and
//! attached to the workload's cgroup, so that opening (or making) any device node outside the
//! rules fails with `EPERM`, as the v1 devices controller does.
//!
//! The kernel runs the program on every device access by a member of the cgroup with
//! `struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }`, where `access_type`
//! is `(access << 16) | type` (access: mknod 1, read 2, write 4; type: block 1, char 2); it
//! allows the access when the program returns 1. The program is a straight list of rules, each
//! a few comparisons that jump to the next rule on a mismatch, and ends denying. It is
//! attached with `BPF_F_ALLOW_MULTI`, so programs an init system attached to the cgroups above
//! still apply as well.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

// linux/bpf.h.
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;

/// One `devices.allow` line: `TYPE MAJOR:MINOR ACCESS`, `*` for any major or minor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// 1 block, 2 char, `None` both (`a`).
    pub kind: Option<u32>,
    pub major: Option<u32>,
    pub minor: Option<u32>,
    /// Bits: mknod 1, read 2, write 4.
    pub access: u32,
}

impl Rule {
    /// Parses `c 195:1 rwm`, `c 136:* rw`, `b *:* m`, `a`.
    pub fn parse(line: &str) -> Result<Rule, String> {
        let bad = || format!("not a device rule: {line:?}");
        let mut it = line.split_whitespace();
        let kind = match it.next().ok_or_else(bad)? {
            "a" => {
                return Ok(Rule {
                    kind: None,
                    major: None,
                    minor: None,
                    access: 7,
                });
            }
            "b" => Some(1),
            "c" => Some(2),
            _ => return Err(bad()),
        };
        let (major, minor) = it.next().ok_or_else(bad)?.split_once(':').ok_or_else(bad)?;
        let number = |s: &str| -> Result<Option<u32>, String> {
            if s == "*" {
                Ok(None)
            } else {
                s.parse::<u32>().map(Some).map_err(|_| bad())
            }
        };
        let mut access = 0;
        for c in it.next().unwrap_or("rwm").chars() {
            access |= match c {
                'm' => 1,
                'r' => 2,
                'w' => 4,
                _ => return Err(bad()),
            };
        }
        if it.next().is_some() {
            return Err(bad());
        }
        Ok(Rule {
            kind,
            major: number(major)?,
            minor: number(minor)?,
            access,
        })
    }
}

/// `struct bpf_insn`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Insn {
    code: u8,
    /// `dst | src << 4`.
    regs: u8,
    off: i16,
    imm: i32,
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}

// Opcodes used (class | op | source).
const LDX_W: u8 = 0x61; // dst = *(u32 *)(src + off)
const AND_K: u8 = 0x57; // dst &= imm (64-bit)
const RSH_K: u8 = 0x77; // dst >>= imm
const MOV_X: u8 = 0xbf; // dst = src
const MOV_K: u8 = 0xb7; // dst = imm
const JNE_K: u8 = 0x55; // if dst != imm goto pc + off
const EXIT: u8 = 0x95;

/// The program for `rules`: registers r3 type, r2 access, r4 major, r5 minor.
fn program(rules: &[Rule]) -> Vec<Insn> {
    let mut p = vec![
        insn(LDX_W, 2, 1, 0, 0),
        insn(MOV_X, 3, 2, 0, 0),
        insn(AND_K, 3, 0, 0, 0xffff),
        insn(RSH_K, 2, 0, 0, 16),
        insn(LDX_W, 4, 1, 4, 0),
        insn(LDX_W, 5, 1, 8, 0),
    ];
    for r in rules {
        // The comparisons that must hold, then the access check and the allow.
        let mut checks: Vec<(u8, u32)> = Vec::new();
        if let Some(k) = r.kind {
            checks.push((3, k));
        }
        if let Some(m) = r.major {
            checks.push((4, m));
        }
        if let Some(m) = r.minor {
            checks.push((5, m));
        }
        let len = checks.len() + 5;
        for (i, (reg, value)) in checks.iter().enumerate() {
            p.push(insn(JNE_K, *reg, 0, (len - 1 - i) as i16, *value as i32));
        }
        p.push(insn(MOV_X, 0, 2, 0, 0));
        p.push(insn(AND_K, 0, 0, 0, (!r.access & 7) as i32));
        // Any access bit the rule does not grant: next rule.
        p.push(insn(JNE_K, 0, 0, 2, 0));
        p.push(insn(MOV_K, 0, 0, 0, 1));
        p.push(insn(EXIT, 0, 0, 0, 0));
    }
    p.push(insn(MOV_K, 0, 0, 0, 0));
    p.push(insn(EXIT, 0, 0, 0, 0));
    p
}

/// The part of `union bpf_attr` that `BPF_PROG_LOAD` reads, zero beyond.
#[repr(C)]
#[derive(Default)]
struct LoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    _rest: [u64; 8],
}

/// The part of `union bpf_attr` that `BPF_PROG_ATTACH` reads.
#[repr(C)]
#[derive(Default)]
struct AttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
    _rest: [u32; 11],
}

fn bpf<T>(cmd: libc::c_long, attr: &T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a zero-padded bpf_attr prefix of the size passed, read by the kernel.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *const T, std::mem::size_of::<T>()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// Loads the program for `rules` (not attached).
fn load(rules: &[Rule]) -> io::Result<OwnedFd> {
    let insns = program(rules);
    let license = CString::new("Apache-2.0").map_err(io::Error::other)?;
    let mut name = [0u8; 16];
    name[..14].copy_from_slice(b"tessera_device");
    let attr = LoadAttr {
        prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name: name,
        expected_attach_type: BPF_CGROUP_DEVICE,
        ..LoadAttr::default()
    };
    let fd = bpf(BPF_PROG_LOAD, &attr)?;
    // SAFETY: a new fd the kernel returned, owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether this host loads device programs (`Err`: why not).
pub fn available() -> Result<(), String> {
    load(&[])
        .map(drop)
        .map_err(|e| format!("cannot load a BPF device program: {e}"))
}

/// Holds the members of the cgroup v2 directory `cgroup` to `lines` (`devices.allow` lines).
pub fn attach(cgroup: &Path, lines: &[String]) -> io::Result<()> {
    let rules: Vec<Rule> = lines
        .iter()
        .map(|l| Rule::parse(l).map_err(io::Error::other))
        .collect::<io::Result<_>>()?;
    let prog = load(&rules)?;
    let path = CString::new(cgroup.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: a live C string.
    let dir = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if dir < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd, owned here.
    let dir = unsafe { OwnedFd::from_raw_fd(dir) };
    let attr = AttachAttr {
        target_fd: dir.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
        ..AttachAttr::default()
    };
    bpf(BPF_PROG_ATTACH, &attr).map(drop).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot attach the device program to {}: {e}", cgroup.display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_as_devices_allow_writes_them() {
        assert_eq!(
            Rule::parse("c 195:1 rwm").unwrap(),
            Rule {
                kind: Some(2),
                major: Some(195),
                minor: Some(1),
                access: 7
            }
        );
        let r = Rule::parse("c 136:* rw").unwrap();
        assert_eq!((r.minor, r.access), (None, 6));
        assert_eq!(Rule::parse("a").unwrap().kind, None);
        for bad in ["", "x 1:2 r", "c 1 r", "c 1:2 rx", "c a:2 r", "c 1:2 r extra"] {
            assert!(Rule::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn each_rule_jumps_to_the_next_on_a_mismatch() {
        let rules = [Rule::parse("c 195:1 rw").unwrap(), Rule::parse("c 136:* rwm").unwrap()];
        let p = program(&rules);
        // 6 loads, rule 1: 3 checks + 5, rule 2: 2 checks + 5, deny: 2.
        assert_eq!(p.len(), 6 + 8 + 7 + 2);
        // Rule 1's checks land on rule 2's first instruction (index 14).
        for (i, ins) in p[6..9].iter().enumerate() {
            assert_eq!(ins.code, JNE_K);
            assert_eq!(6 + i as i64 + 1 + ins.off as i64, 14);
        }
        // Its access check masks what the rule does not grant (mknod).
        assert_eq!((p[10].code, p[10].imm), (AND_K, 1));
        assert_eq!(p.last().unwrap().code, EXIT);
    }
}
