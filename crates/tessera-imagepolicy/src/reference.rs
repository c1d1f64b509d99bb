//! Container image references (`[registry/]repository[:tag][@sha256:digest]`), normalised as
//! Docker does: no registry means `docker.io`, and a one-component Docker Hub repository is
//! under `library/` (`ubuntu` is `docker.io/library/ubuntu:latest`).

use std::fmt;

/// Docker Hub's canonical name; `index.docker.io` is the same registry.
pub const DOCKER_HUB: &str = "docker.io";

/// A parsed, normalised image reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// `docker.io`, `registry.example.com`, `localhost:5000` …
    pub registry: String,
    /// `library/ubuntu`, `team-a/train` …
    pub repository: String,
    /// `None` when the reference has a digest and no tag.
    pub tag: Option<String>,
    /// `sha256:` and 64 lower-case hex digits.
    pub digest: Option<String>,
}

/// Whether `c` looks like a registry host rather than a repository component (Docker's rule:
/// it has a `.` or a `:`, or is `localhost`).
fn is_registry(c: &str) -> bool {
    c.contains('.') || c.contains(':') || c == "localhost"
}

fn check_component(c: &str) -> Result<(), String> {
    let ok = !c.is_empty()
        && c.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
        && c.as_bytes()[0].is_ascii_alphanumeric()
        && c.as_bytes()[c.len() - 1].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{c}` is not a repository path component (lower-case letters, digits, `.`, `_`, `-`)"
        ))
    }
}

fn check_registry(r: &str) -> Result<(), String> {
    let ok = !r.is_empty()
        && r.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'));
    if ok {
        Ok(())
    } else {
        Err(format!("`{r}` is not a registry host"))
    }
}

/// Checks `sha256:<64 lower-case hex>`.
pub fn check_digest(d: &str) -> Result<(), String> {
    match d.strip_prefix("sha256:") {
        Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) => Ok(()),
        _ => Err(format!("`{d}` is not a sha256 digest (`sha256:` and 64 hex digits)")),
    }
}

impl ImageRef {
    pub fn parse(s: &str) -> Result<ImageRef, String> {
        if s.is_empty() || s.len() > 512 {
            return Err("an image reference has 1–512 characters".into());
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => {
                check_digest(d)?;
                (r, Some(d.to_string()))
            }
            None => (s, None),
        };
        let (name, tag) = match rest.rfind(':') {
            Some(i) if !rest[i..].contains('/') => (&rest[..i], Some(rest[i + 1..].to_string())),
            _ => (rest, None),
        };
        if let Some(t) = &tag {
            let ok = !t.is_empty()
                && t.len() <= 128
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
                && !t.starts_with(['.', '-']);
            if !ok {
                return Err(format!("`{t}` is not a tag"));
            }
        }
        let (registry, repository) = match name.split_once('/') {
            Some((first, repo)) if is_registry(first) => (first.to_string(), repo.to_string()),
            Some(_) => (DOCKER_HUB.to_string(), name.to_string()),
            None => (DOCKER_HUB.to_string(), format!("library/{name}")),
        };
        let registry = if registry == "index.docker.io" {
            DOCKER_HUB.to_string()
        } else {
            registry
        };
        check_registry(&registry)?;
        for c in repository.split('/') {
            check_component(c)?;
        }
        let tag = if tag.is_none() && digest.is_none() {
            Some("latest".to_string())
        } else {
            tag
        };
        Ok(ImageRef {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// `registry/repository`: what policies match and cosign's payload names.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The reference pinned to `digest`: `registry/repository@sha256:…`.
    pub fn pinned(&self, digest: &str) -> String {
        format!("{}@{digest}", self.name())
    }

    /// Whether the image's repository is `prefix` or under it, at a path boundary
    /// (`registry.example.com/team-a` admits `registry.example.com/team-a/train`, not
    /// `registry.example.com/team-ab/train`).
    pub fn is_under(&self, prefix: &str) -> bool {
        let name = self.name();
        let p = normalise_prefix(prefix);
        let p = p.trim_end_matches('/');
        name == p || (name.starts_with(p) && name.as_bytes().get(p.len()) == Some(&b'/'))
    }

    /// The host the registry's API answers on (Docker Hub's is `registry-1.docker.io`).
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            "registry-1.docker.io"
        } else {
            &self.registry
        }
    }
}

/// `index.docker.io/…` is `docker.io/…`.
fn normalise_prefix(p: &str) -> String {
    match p.strip_prefix("index.docker.io/") {
        Some(rest) => format!("{DOCKER_HUB}/{rest}"),
        None => p.to_string(),
    }
}

/// Checks an allowed-registry prefix: a registry host, then optionally repository path
/// components, optionally ending in `/` (`registry.example.com/team-a/`, `docker.io/library`).
pub fn check_prefix(p: &str) -> Result<(), String> {
    if p.is_empty() || p.len() > 255 {
        return Err("a registry prefix has 1–255 characters".into());
    }
    let mut parts = p.trim_end_matches('/').split('/');
    let host = parts.next().unwrap_or_default();
    if !is_registry(host) {
        return Err(format!(
            "`{p}` must start with a registry host (with a `.` or `:`, or `localhost`), e.g. registry.example.com/team-a/ or docker.io/library/"
        ));
    }
    check_registry(host)?;
    for c in parts {
        check_component(c)?;
    }
    Ok(())
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_normalised_as_docker_does() {
        let r = ImageRef::parse("ubuntu").unwrap();
        assert_eq!(r.to_string(), "docker.io/library/ubuntu:latest");
        let r = ImageRef::parse("pytorch/pytorch:2.3").unwrap();
        assert_eq!(r.to_string(), "docker.io/pytorch/pytorch:2.3");
        let r = ImageRef::parse("index.docker.io/library/ubuntu:22.04").unwrap();
        assert_eq!(r.name(), "docker.io/library/ubuntu");
        let r = ImageRef::parse("localhost:5000/team-a/train:v1").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("localhost:5000", "team-a/train")
        );
        let d = format!("sha256:{}", "ab".repeat(32));
        let r = ImageRef::parse(&format!("registry.example.com/a/b@{d}")).unwrap();
        assert_eq!((r.tag.as_deref(), r.digest.as_deref()), (None, Some(d.as_str())));
        for bad in ["", "UPPER/case", "a/b:", "a//b", "a/b@sha256:12", "-x"] {
            assert!(ImageRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn prefixes_match_at_a_path_boundary_only() {
        let r = ImageRef::parse("registry.example.com/team-a/train:1").unwrap();
        assert!(r.is_under("registry.example.com/team-a/"));
        assert!(r.is_under("registry.example.com/team-a"));
        assert!(r.is_under("registry.example.com"));
        assert!(!r.is_under("registry.example.com/team-ab/"));
        assert!(!r.is_under("registry.example.co"));
        let hub = ImageRef::parse("ubuntu:22.04").unwrap();
        assert!(hub.is_under("docker.io/library/"));
        assert!(hub.is_under("index.docker.io/library/"));
        assert!(!hub.is_under("docker.io/pytorch/"));
        assert!(check_prefix("registry.example.com/team-a/").is_ok());
        assert!(check_prefix("team-a/").is_err());
        assert!(check_prefix("https://registry.example.com/").is_err());
    }
}
