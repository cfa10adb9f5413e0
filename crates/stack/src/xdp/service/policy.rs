//! The engine service's policy file: which users may be accelerated on
//! which interfaces, which users trust each other enough to share a UMEM
//! (sharing one means reading each other's packets). Read by root, so opened with
//! `O_NOFOLLOW` and accepted only if it is a regular file owned by root that
//! neither group nor others may write; every refusal is one clear line.
//!
//! ```text
//! # comments and blank lines are ignored
//! allow alice eth0,eth1   # alice may be accelerated on eth0 and eth1
//! allow 1001 *            # uid 1001 on every interface
//! allow * lo0             # every user on lo0
//! trust alice bob         # alice's and bob's processes may share a UMEM
//! ```
//!
//! Without `allow` lines every user may be accelerated on every interface
//! the service manages (the default, as without a file). Users are uids or
//! names from /etc/passwd.

use std::collections::HashSet;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

/// Where `nanowire engine serve` looks when not told (`--policy`); a
/// missing file there means the default policy.
pub const DEFAULT_PATH: &str = "/etc/nanowire/engine.policy";

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// (uid or None = every user, interfaces or None = every interface).
    allow: Vec<(Option<u32>, Option<Vec<String>>)>,
    /// Groups of users that trust each other.
    trust: Vec<HashSet<u32>>,
}

impl Policy {
    /// May `uid` be accelerated on `iface`?
    pub fn allows(&self, uid: u32, iface: &str) -> bool {
        self.allow.is_empty()
            || self.allow.iter().any(|(u, i)| {
                u.is_none_or(|u| u == uid)
                    && i.as_ref().is_none_or(|l| l.iter().any(|n| n == iface))
            })
    }

    /// May the processes of `a` and `b` share a UMEM?
    pub fn trusts(&self, a: u32, b: u32) -> bool {
        a == b || self.trust.iter().any(|g| g.contains(&a) && g.contains(&b))
    }

    /// Parse the file's text; `Err` names the line and what is wrong.
    pub fn parse(text: &str, users: &dyn Fn(&str) -> Option<u32>) -> Result<Policy, String> {
        let mut p = Policy::default();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |why: String| format!("line {}: {why}: {raw:?}", n + 1);
            let uid = |w: &str| {
                w.parse::<u32>()
                    .ok()
                    .or_else(|| users(w))
                    .ok_or_else(|| bad(format!("unknown user {w:?}")))
            };
            let words: Vec<&str> = line.split_whitespace().collect();
            match words[0] {
                "allow" => {
                    if words.len() != 3 {
                        return Err(bad("`allow USER|* IFACE[,IFACE..]|*` expected".into()));
                    }
                    let u = if words[1] == "*" {
                        None
                    } else {
                        Some(uid(words[1])?)
                    };
                    let i = if words[2] == "*" {
                        None
                    } else {
                        let l: Vec<String> = words[2].split(',').map(str::to_string).collect();
                        if l.iter().any(|x| !valid_iface(x)) {
                            return Err(bad("bad interface name".into()));
                        }
                        Some(l)
                    };
                    p.allow.push((u, i));
                }
                "trust" => {
                    if words.len() < 3 {
                        return Err(bad("`trust USER USER [USER..]` expected".into()));
                    }
                    let g = words[1..]
                        .iter()
                        .map(|w| uid(w))
                        .collect::<Result<HashSet<u32>, String>>()?;
                    p.trust.push(g);
                }
                w => return Err(bad(format!("unknown keyword {w:?}"))),
            }
        }
        Ok(p)
    }

    /// Read the policy at `path`. `explicit`: the operator named it (then a
    /// missing file is an error; the default path may be absent).
    pub fn load(path: &str, explicit: bool) -> Result<Policy, String> {
        let e = |why: String| format!("engine service policy {path}: {why}");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path);
        let f = match f {
            Ok(f) => f,
            Err(x) if x.kind() == std::io::ErrorKind::NotFound && !explicit => {
                return Ok(Policy::default());
            }
            Err(x) if x.raw_os_error() == Some(libc::ELOOP) => {
                return Err(e("is a symbolic link (refused)".into()));
            }
            Err(x) => return Err(e(x.to_string())),
        };
        // Checked on the open file, not the name: nothing can swap it.
        let m = f.metadata().map_err(|x| e(x.to_string()))?;
        if !m.file_type().is_file() {
            return Err(e("not a regular file".into()));
        }
        if m.uid() != 0 {
            return Err(e(format!("owned by uid {}, not root", m.uid())));
        }
        if m.mode() & 0o022 != 0 {
            return Err(e(format!(
                "mode {:o}: group or others may write it",
                m.mode() & 0o7777
            )));
        }
        let mut text = String::new();
        f.take(1 << 20)
            .read_to_string(&mut text)
            .map_err(|x| e(x.to_string()))?;
        Policy::parse(&text, &passwd_uid).map_err(e)
    }
}

fn valid_iface(s: &str) -> bool {
    !s.is_empty()
        && s.len() < 16
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.@".contains(&c))
}

/// A user name's uid from /etc/passwd (no NSS: a user only a directory
/// service knows is written as its uid).
fn passwd_uid(name: &str) -> Option<u32> {
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == name).then_some(())?;
        f.nth(1)?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users(n: &str) -> Option<u32> {
        match n {
            "alice" => Some(1000),
            "bob" => Some(1001),
            _ => None,
        }
    }

    #[test]
    fn the_default_allows_everyone_everywhere_and_trusts_nobody_else() {
        let p = Policy::parse("# nothing\n\n", &users).unwrap();
        assert!(p.allows(1000, "eth0") && p.allows(0, "lo"));
        assert!(p.trusts(7, 7) && !p.trusts(1000, 1001));
    }

    #[test]
    fn allow_and_trust_lines() {
        let p = Policy::parse(
            "allow alice eth0,eth1 # two\nallow 2000 *\nallow * lo0\ntrust alice bob 3000\n",
            &users,
        )
        .unwrap();
        assert!(p.allows(1000, "eth0") && p.allows(1000, "eth1") && !p.allows(1000, "eth2"));
        assert!(p.allows(2000, "anything") && p.allows(42, "lo0") && !p.allows(1001, "eth0"));
        assert!(p.trusts(1000, 1001) && p.trusts(3000, 1000) && !p.trusts(1000, 2000));
    }

    #[test]
    fn a_bad_line_is_named() {
        for (t, want) in [
            ("allow alice\n", "line 1: `allow"),
            ("\nallow mallory eth0\n", "line 2: unknown user \"mallory\""),
            ("trust alice\n", "`trust USER USER"),
            ("allow * eth/0\n", "bad interface name"),
            ("deny alice\n", "unknown keyword \"deny\""),
        ] {
            let e = Policy::parse(t, &users).unwrap_err();
            assert!(e.contains(want), "{t:?}: {e}");
        }
    }

    #[test]
    fn the_file_must_be_roots_not_writable_by_others_and_no_link() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("nw-policy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("p");
        std::fs::write(&f, "trust 1 2\n").unwrap();
        let path = f.to_str().unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let root = rustix::process::geteuid().is_root();
        if root {
            assert!(Policy::load(path, true).unwrap().trusts(1, 2));
        } else {
            assert!(Policy::load(path, true).unwrap_err().contains("not root"));
        }
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = Policy::load(path, true).unwrap_err();
        assert!(
            e.contains(if root { "mode 666" } else { "not root" }),
            "{e}"
        );
        let l = dir.join("link");
        std::os::unix::fs::symlink(&f, &l).unwrap();
        let e = Policy::load(l.to_str().unwrap(), true).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        let missing = dir.join("missing");
        assert!(Policy::load(missing.to_str().unwrap(), true).is_err());
        assert_eq!(
            Policy::load(missing.to_str().unwrap(), false).unwrap(),
            Policy::default()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
