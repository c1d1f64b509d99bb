//! The CLI as a user runs it, against a real `tessera serve`: `login` stores a 0600 credential,
//! verbs print tables, and server errors become one readable line with a non-zero exit code.

use std::path::Path;
use std::time::Duration;

use crate::support::{Serving, TempDir, serve_command, tessera, tessera_with_stdin, wait_until_serving};

/// `tessera serve` on the seed fleet with its data in `data`.
fn serve(data: &Path) -> Serving {
    let mut cmd = serve_command();
    cmd.args(["--listen", "127.0.0.1:0", "--data-dir"]).arg(data);
    wait_until_serving(&mut cmd, Duration::from_secs(30))
}

/// `tessera run` in vision/train with `args`.
fn run_in_vision_train<'a>(args: &[&'a str]) -> Vec<&'a str> {
    [&["run", "--tenant", "vision", "--project", "train"][..], args].concat()
}

#[test]
fn login_verbs_and_errors() {
    let dir = TempDir::new("cli");
    let mut server = serve(&dir.0.join("data"));
    let token = server.admin_token.clone().unwrap_or_default();
    let config = dir.0.join("config");
    let env = [
        ("TESSERA_SERVER", server.base.as_str()),
        ("XDG_CONFIG_HOME", config.to_str().unwrap()),
    ];

    let (code, _, err) = tessera_with_stdin(&["login"], &env, "tsr_wrong\n");
    assert_ne!(code, 0);
    assert!(
        err.starts_with("error: the server at") && err.trim().lines().count() == 1,
        "{err}"
    );
    let (code, out, err) = tessera_with_stdin(&["login"], &env, &format!("{token}\n"));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("mode 0600"));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(config.join("tessera/credentials.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // Verbs use the stored credential.
    assert_eq!(tessera(&["tenants", "create", "vision"], &env).0, 0);
    assert_eq!(
        tessera(&["projects", "--tenant", "vision", "create", "train"], &env).0,
        0
    );
    let (code, out, _) = tessera(&run_in_vision_train(&["--mig", "3g.40gb", "--duration", "1h"]), &env);
    assert_eq!(code, 0);
    assert!(out.starts_with("ID  TENANT/PROJECT"), "{out}");
    let (code, out, _) = tessera(&["pools"], &env);
    assert_eq!(code, 0);
    assert!(out.contains("serving      mig") && out.contains("0.5 / 224"), "{out}");
    // One process on SQLite leads; `status` says so, and lists it as the leader.
    let (code, out, err) = tessera(&["status"], &env);
    assert_eq!(code, 0, "{err}");
    let first = out.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("Leader: ") && first.ends_with(" (SQLite: the only replica)"),
        "{out}"
    );
    assert!(out.lines().nth(3).is_some_and(|l| l.contains("  leader  ")), "{out}");
    // A dry run prints the cost and outcome and creates nothing (the pool still holds 0.5).
    let dry_run = run_in_vision_train(&["--mig", "3g.40gb", "--duration", "2h", "--dry-run"]);
    let (code, out, err) = tessera(&dry_run, &env);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("would borrow in pool serving") && out.contains("unit-hours  1.00"),
        "{out}"
    );
    let (_, out, _) = tessera(&["pools"], &env);
    assert!(out.contains("0.5 / 224"), "a dry run creates nothing: {out}");
    // Over its limit a request waits, with the sentence; `ls` says why in one word.
    let quota = ["quota", "set", "--tenant", "vision", "--class", "serving"];
    let (code, _, err) = tessera(&[&quota[..], &["--guaranteed", "0.5", "--limit", "0.5"]].concat(), &env);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = tessera(&run_in_vision_train(&["--mig", "3g.40gb", "--name", "over"]), &env);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("reason: tenant vision holds 0.5 GPU units in serving (guaranteed 0.5, limit 0.5)"),
        "{out}"
    );
    let (_, out, _) = tessera(&["ls"], &env);
    let row = out
        .lines()
        .find(|l| l.contains(" over "))
        .expect("the waiting request is listed");
    assert!(row.contains(" queued (quota)"), "{out}");
    let id = row.split_whitespace().next().unwrap();
    assert_eq!(tessera(&["cancel", id], &env).0, 0);
    let unset = ["quota", "unset", "--tenant", "vision", "--class", "serving"];
    assert_eq!(tessera(&unset, &env).0, 0);
    // A server-side refusal is one readable line and a non-zero exit: 9 GPUs are more than
    // one node holds, so a gang of whole 8-GPU nodes, which 9 cannot be.
    let (code, out, err) = tessera(&run_in_vision_train(&["--gpus", "9"]), &env);
    assert_ne!(code, 0);
    assert!(out.is_empty());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: 422 Invalid request: 9 GPUs as whole nodes of 8 GPUs: ask for a multiple of 8"),
        "{err}"
    );
    // With --remainder, 12 GPUs are a whole node and 4 GPUs of another, shown as such by
    // `describe`; it goes with --gpus alone.
    let remainder = run_in_vision_train(&["--gpus", "12", "--pool", "training", "--remainder", "--name", "rem"]);
    let (code, out, err) = tessera(&[&remainder[..], &["--dry-run"]].concat(), &env);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("would borrow in pool training on node 2 node-shares in r0 (2 nodes)"),
        "{out}"
    );
    let (code, out, err) = tessera(&remainder, &env);
    assert_eq!(code, 0, "{err}");
    let id = out
        .lines()
        .find(|l| l.contains(" rem "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("{out}"))
        .to_string();
    let (code, out, err) = tessera(&["describe", &id], &env);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("12×GPU (whole nodes, the last with the remainder)  (12 GPU units)"),
        "{out}"
    );
    assert_eq!(tessera(&["cancel", &id], &env).0, 0);
    let (code, _, err) = tessera(
        &run_in_vision_train(&["--gpus", "12", "--gpus-per-node", "4", "--remainder"]),
        &env,
    );
    assert_ne!(code, 0);
    assert!(err.contains("--remainder") && err.contains("--gpus-per-node"), "{err}");
    // And a gang no rack holds is refused naming the rack's capacity.
    let (code, _, err) = tessera(
        &run_in_vision_train(&["--gpus", "64", "--pool", "training", "--topology", "rack"]),
        &env,
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("64 GPUs in one rack; the largest rack of pool training") && err.contains("at most 32"),
        "{err}"
    );
    let (code, _, err) = tessera(&run_in_vision_train(&["--fraction", "100", "--duration", "-5m"]), &env);
    assert_ne!(code, 0);
    assert!(err.contains("negative"), "{err}");
    // Node lifecycle and GPU health (platform-admin).
    let (code, out, err) = tessera(&["node", "cordon", "h100-01"], &env);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "node h100-01 is cordoned");
    let (code, out, _) = tessera(&["nodes", "--pool", "training", "-o", "json"], &env);
    assert_eq!(code, 0);
    let nodes: serde_json::Value = serde_json::from_str(&out).unwrap();
    let state = |name: &str| {
        nodes.as_array().unwrap().iter().find(|n| n["name"] == name).unwrap()["state"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        (state("h100-01").as_str(), state("h100-00").as_str()),
        ("cordoned", "ready")
    );
    let (code, out, _) = tessera(&["nodes", "--pool", "training"], &env);
    assert_eq!(code, 0);
    let head = out.lines().next().unwrap();
    assert!(head.ends_with("STATE") && head.contains("NVLINK    TOPOLOGY"), "{out}");
    // The seed fleet's training servers stand in racks of 4: each node's rack is shown.
    let row = |name: &str| {
        out.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        row("h100-01").contains("rack r0") && row("h100-01").contains("cordoned"),
        "{out}"
    );
    assert!(row("h100-05").contains("rack r1"), "{out}");
    let (code, out, _) = tessera(&["nodes", "--pool", "serving"], &env);
    assert_eq!(code, 0);
    assert!(out.lines().nth(1).unwrap_or_default().contains("rack s0"), "{out}");
    // An image policy from a key file (the OpenSSL-made cosign fixture); its refusals below.
    let key = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tessera-imagepolicy/tests/fixtures/cosign.pub"
    );
    let (code, out, err) = tessera(
        &[
            "tenants",
            "policy",
            "set",
            "vision",
            "--registry",
            "registry.example.com/team-a/",
            "--cosign-key",
            key,
        ],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("registries registry.example.com/team-a/") && out.contains("one of 1 key(s)"),
        "{out}"
    );
    let not_a_key = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    for (args, says) in [
        (
            vec!["tenants", "policy", "set", "vision", "--cosign-key", not_a_key],
            "(field `cosign_keys[0]`)",
        ),
        (
            run_in_vision_train(&["--mig", "1g.10gb", "--image", "ubuntu:22.04"]),
            "image docker.io/library/ubuntu:22.04 is not from an allowed registry",
        ),
        (
            vec!["node", "drain", "h100-01", "--deadline-s", "5", "--after", "kill"],
            "either `preempt` or `wait`",
        ),
        (vec!["node", "cordon", "h100-99"], "no node `h100-99`"),
        (vec!["gpu", "clear", "h100-01"], "NODE/GPU"),
        (vec!["gpu", "clear", "h100-01/0"], "is not marked unhealthy"),
        (vec!["node", "mig", "disable", "h100-01/0"], "only in mig pools"),
        (vec!["node", "mig", "disable", "a100-03/2"], "drain it first"),
        (vec!["node", "mig", "enable", "a100-03/x"], "not a GPU index"),
    ] {
        let (code, out, err) = tessera(&args, &env);
        assert_ne!(code, 0, "{args:?}");
        assert!(out.is_empty());
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.starts_with("error: ") && err.contains(says), "{args:?}: {err}");
    }
    let (code, out, _) = tessera(&["tenants", "policy", "unset", "vision"], &env);
    assert_eq!((code, out.trim()), (0, "image policy of vision removed"));
    // The same policy declared in `tessera apply` (key inline as PEM): created, then unchanged,
    // then changed.
    let apply = TempDir::new("apply");
    let decl = |registry: &str| {
        let pem = std::fs::read_to_string(key).unwrap();
        let pem: String = pem.lines().map(|l| format!("          {l}\n")).collect();
        let f = apply.0.join("tenants.yaml");
        std::fs::write(
            &f,
            format!(
                "tenants:\n  - name: imgteam\n    image_policy:\n      registries: [\"{registry}\"]\n      cosign_keys:\n        - |\n{pem}"
            ),
        )
        .unwrap();
        f.to_string_lossy().to_string()
    };
    let f = decl("registry.example.com/team-a/");
    let (code, out, err) = tessera(&["apply", "-f", &f], &env);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("+ tenant imgteam")
            && out.contains("+ image policy imgteam: registries [registry.example.com/team-a/], 1 cosign key(s)"),
        "{out}"
    );
    let (code, out, _) = tessera(&["apply", "-f", &f], &env);
    assert!(code == 0 && out.starts_with("no changes"), "{out}");
    let f = decl("registry.example.com/team-b/");
    let (code, out, _) = tessera(&["apply", "-f", &f], &env);
    assert!(
        code == 0 && out.contains("~ image policy imgteam: registries [registry.example.com/team-a/], 1 cosign key(s) → registries [registry.example.com/team-b/]"),
        "{out}"
    );
    let (code, out, _) = tessera(&["tenants", "policy", "get", "imgteam"], &env);
    assert!(code == 0 && out.contains("registry.example.com/team-b/"), "{out}");
    // A malformed declaration is one line naming the file, the line and what was expected.
    let bad = apply.0.join("bad.yaml");
    std::fs::write(&bad, "tenants:\n  - name: imgteam\n    quotas:\n      serving: 4\n").unwrap();
    let (code, _, err) = tessera(&["apply", "-f", bad.to_str().unwrap()], &env);
    assert_ne!(code, 0);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("bad.yaml:4: tenants[0].quotas.serving: invalid type: integer `4`, expected a quota in GPU units such as {guaranteed: 8, limit: 16}"),
        "{err}"
    );
    std::fs::remove_dir_all(&apply.0).unwrap();
    let (code, out, _) = tessera(&["gpu", "health"], &env);
    assert_eq!((code, out.trim()), (0, "all GPUs are healthy"));
    // MIG mode on a GPU of a cordoned node: off, then every GPU of the node on again.
    assert_eq!(tessera(&["node", "cordon", "a100-03"], &env).0, 0);
    let (code, out, err) = tessera(&["node", "mig", "disable", "a100-03/2"], &env);
    assert_eq!(
        (code, out.trim()),
        (0, "a100-03/2: MIG off; serves whole GPUs"),
        "{err}"
    );
    let (code, out, err) = tessera(&["node", "mig", "enable", "a100-03"], &env);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 8, "{out}");
    assert!(out.contains("a100-03/0: MIG on already"), "{out}");
    assert!(out.contains("a100-03/2: MIG on; serves MIG instances"), "{out}");
    assert_eq!(tessera(&["node", "uncordon", "a100-03"], &env).0, 0);
    let (code, out, _) = tessera(&["node", "uncordon", "h100-01"], &env);
    assert_eq!((code, out.trim()), (0, "node h100-01 is ready"));
    assert_eq!(tessera(&["logout"], &env).0, 0);
    let (code, _, err) = tessera(&["pools"], &env);
    assert_ne!(code, 0, "no credential after logout");
    assert!(err.contains("tessera login"), "{err}");
    server.kill();
}

/// The last platform-admin token cannot be revoked; an operator who has lost it gets a new one
/// with `tessera admin recover --data-dir DIR` (file-system access, no token), while the server
/// runs; after a restart the recovered token still works and no other is made.
#[test]
fn the_last_admin_token_stays_and_admin_recover_issues_a_new_one() {
    let dir = TempDir::new("cli-recover");
    let data = dir.0.join("data");
    let mut server = serve(&data);
    let first = server
        .admin_token
        .clone()
        .expect("the first start makes an admin token");
    let config = dir.0.join("config");
    let env = [
        ("TESSERA_SERVER", server.base.as_str()),
        ("XDG_CONFIG_HOME", config.to_str().unwrap()),
    ];

    let (code, out, err) = tessera(&["--token", &first, "token", "revoke", "tok-admin"], &env);
    assert_ne!(code, 0, "{out}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: 409") && err.contains("last platform-admin token"),
        "{err}"
    );

    let data_dir = data.to_str().unwrap();
    let (code, out, err) = tessera(&["admin", "recover", "--data-dir", data_dir], &env);
    assert_eq!(code, 0, "{err}");
    let recovered = out
        .lines()
        .find_map(|l| l.strip_prefix("Admin token: "))
        .expect("the new token is printed")
        .to_string();
    assert!(recovered.starts_with("tsr_") && recovered != first);
    assert_eq!(
        std::fs::read_to_string(data.join("admin-token")).unwrap().trim(),
        recovered
    );
    // Two lasting admin tokens now: the first may go.
    let (code, _, err) = tessera(&["--token", &recovered, "token", "revoke", "tok-admin"], &env);
    assert_eq!(code, 0, "{err}");
    let (code, _, _) = tessera(&["--token", &first, "pools"], &env);
    assert_ne!(code, 0, "the revoked token fails");

    // A restart makes no other admin token, and the recovered one works.
    server.kill();
    let mut server = serve(&data);
    assert_eq!(server.admin_token, None, "no new admin token at restart");
    let env = [
        ("TESSERA_SERVER", server.base.as_str()),
        ("XDG_CONFIG_HOME", config.to_str().unwrap()),
    ];
    let (code, out, err) = tessera(&["--token", &recovered, "-o", "json", "token", "ls"], &env);
    assert_eq!(code, 0, "{err}");
    let tokens: serde_json::Value = serde_json::from_str(&out).unwrap();
    let active: Vec<&str> = tokens
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["revoked_at"].is_null())
        .map(|t| t["role"].as_str().unwrap())
        .collect();
    assert_eq!(active, ["platform-admin"]);

    // A directory that holds no store is refused.
    let (code, _, err) = tessera(
        &[
            "admin",
            "recover",
            "--data-dir",
            dir.0.join("nothing").to_str().unwrap(),
        ],
        &env,
    );
    assert_ne!(code, 0);
    assert!(err.contains("holds no Tessera store"), "{err}");
    server.kill();
}

/// `tessera apply -f` is all or nothing and its dry run fails as the apply would: a good tenant
/// before a bad name, a tenant listed twice, a quota for an undeclared project each exit
/// non-zero with one line naming the file and the entry, and change nothing. Priority classes
/// are granted by the admin (`tenants set --priorities`, or in the file), not taken by a member.
/// And flag numbers JSON cannot carry (`NaN`) are one clear line.
#[test]
fn apply_is_all_or_nothing_and_priorities_are_granted() {
    let dir = TempDir::new("cli-apply");
    let mut server = serve(&dir.0.join("data"));
    let token = server.admin_token.clone().unwrap_or_default();
    let env = [
        ("TESSERA_SERVER", server.base.as_str()),
        ("TESSERA_TOKEN", token.as_str()),
    ];
    let tenants = || {
        let (code, out, err) = tessera(&["-o", "json", "tenants"], &env);
        assert_eq!(code, 0, "{err}");
        out
    };
    let before = tenants();
    let write = |name: &str, text: &str| {
        let f = dir.0.join(name);
        std::fs::write(&f, text).unwrap();
        f.to_string_lossy().to_string()
    };
    let good = "  - name: good1\n    projects: [train]\n    quotas:\n      training: {guaranteed: 8, limit: 16}\n";
    for (file, text, says) in [
        (
            "badname.yaml",
            format!("tenants:\n{good}  - name: Bad_Name\n"),
            "`Bad_Name` is not a valid name",
        ),
        (
            "twice.yaml",
            format!("tenants:\n{good}{good}"),
            "tenant `good1` is declared twice (tenants[0] and tenants[1])",
        ),
        (
            "ghost.yaml",
            format!("tenants:\n{good}  - name: good2\n    quotas:\n      project:ghost: {{guaranteed: 1}}\n"),
            "tenant `good2` has no project `ghost`",
        ),
    ] {
        let f = write(file, &text);
        for dry in [true, false] {
            let args: Vec<&str> = if dry {
                vec!["apply", "-f", &f, "--dry-run"]
            } else {
                vec!["apply", "-f", &f]
            };
            let (code, out, err) = tessera(&args, &env);
            assert_ne!(code, 0, "{file} dry {dry}: {out}");
            assert!(out.is_empty(), "{out}");
            assert_eq!(err.trim().lines().count(), 1, "{err}");
            assert!(
                err.starts_with(&format!("error: {f}: 422")) && err.contains(says),
                "{file}: {err}"
            );
        }
        assert_eq!(tenants(), before, "{file}: nothing changed");
    }

    // A member cannot take a class; the admin grants one, in the file or with `tenants set`.
    let f = write(
        "ok.yaml",
        &format!("tenants:\n{good}    priorities: [standard, high]\n"),
    );
    let (code, out, err) = tessera(&["apply", "-f", &f, "--dry-run"], &env);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("would be made (dry run)"), "{out}");
    assert_eq!(tenants(), before, "a dry run changes nothing");
    let (code, out, err) = tessera(&["apply", "-f", &f], &env);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("+ tenant good1 (priority classes standard, high)") && out.contains("3 change(s) applied"),
        "{out}"
    );
    let (code, out, err) = tessera(
        &["-o", "json", "token", "create", "--tenant", "good1", "--role", "member"],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    let t: serde_json::Value = serde_json::from_str(&out).unwrap();
    let member = t["token"].as_str().unwrap().to_string();
    let member_env = [
        ("TESSERA_SERVER", server.base.as_str()),
        ("TESSERA_TOKEN", member.as_str()),
    ];
    let run = |priority: &str| {
        tessera(
            &[
                "run",
                "--tenant",
                "good1",
                "--project",
                "train",
                "--fraction",
                "100",
                "--priority",
                priority,
            ],
            &member_env,
        )
    };
    let (code, _, err) = run("critical");
    assert_ne!(code, 0);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.starts_with(
            "error: 403 Priority class not granted: tenant `good1` may use the priority classes standard, high"
        ),
        "{err}"
    );
    let (code, _, err) = tessera(&["tenants", "set", "good1", "--priorities", "critical"], &member_env);
    assert_ne!(code, 0);
    assert!(err.starts_with("error: 403"), "{err}");
    let (code, out, err) = tessera(&["tenants", "set", "good1", "--priorities", "standard,critical"], &env);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        "tenant good1 may use the priority classes standard, critical"
    );
    let (code, out, err) = run("critical");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("good1/train"), "{out}");
    let (code, out, _) = tessera(&["audit", "--tenant", "good1"], &env);
    assert_eq!(code, 0);
    assert!(
        out.contains("priority classes standard, high → standard, critical"),
        "{out}"
    );

    // NaN is not a number of GPU units: one line, before anything is sent.
    let quota = ["quota", "set", "--tenant", "good1", "--class", "training"];
    for args in [
        [&quota[..], &["--guaranteed", "NaN"]].concat(),
        [&quota[..], &["--guaranteed", "1", "--limit", "inf"]].concat(),
        vec!["budget", "--tenant", "good1", "--gpu-hours", "NaN"],
    ] {
        let args = &args[..];
        let (code, _, err) = tessera(args, &env);
        assert_ne!(code, 0, "{args:?}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("is not a number of GPU units"), "{args:?}: {err}");
    }
    server.kill();
}

/// `tessera sim scenario` takes the queue order and the holds per pool and says which it ran
/// with; an unknown order is one readable line.
#[test]
fn sim_scenario_runs_with_the_order_and_holds_asked_for() {
    let (code, out, err) = tessera(
        &[
            "sim",
            "scenario",
            "--tenants",
            "4",
            "--hours",
            "2",
            "--order",
            "largest-first",
            "--holds-per-pool",
            "3",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (v["order"].as_str(), v["holds_per_pool"].as_u64()),
        (Some("largest-first"), Some(3)),
        "{v}"
    );
    assert!(v["placed"].as_u64().unwrap() > 0, "{v}");
    let (code, out, _) = tessera(&["sim", "scenario", "--tenants", "4", "--hours", "2"], &[]);
    assert_eq!(code, 0);
    assert!(out.contains("fair-share order, 1 hold(s) per pool"), "{out}");
    let (code, _, err) = tessera(&["sim", "scenario", "--order", "biggest"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("invalid value 'biggest' for '--order <ORDER>'"), "{err}");
}
