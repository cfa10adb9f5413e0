//! The steering program `nanowire run` attaches before it execs the
//! program (issue 21, "prestart"; nanowire_xdp::prestart): the program's
//! first engine adopts it, nothing of it leaks to children, a process that
//! forks before its engine started gives it up, and a description that does
//! not check out is refused with one line. Each test in its own lab with
//! the default offloads, against a plain TCP echo server in host b.

mod run_support;

use nanowire_lab::testbed::{Host, ScopedLab};
use run_support::*;
use std::time::Duration;

const B: &str = "198.18.0.2";

/// The interpreter itself, not a wrapper that execs it (a pyenv shim is a
/// shell script: an exec before the engine starts gives the prepared
/// program up, as it should).
fn python() -> &'static str {
    if std::path::Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// A plain TCP echo server in host b on `port` (one connection at a time,
/// for ever).
fn echo_server(lab: &ScopedLab, port: u16) -> Kid {
    let src = format!(
        "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         s.bind(('{B}',{port}))\ns.listen(16)\nprint('listening',flush=True)\n\
         while True:\n  c,_=s.accept()\n  while True:\n    d=c.recv(4096)\n    if not d: break\n    \
         c.sendall(d)\n  c.close()\n"
    );
    let mut k = spawn(
        &format!("echo-{port}"),
        plain_in(lab, Host::B, &["python3", "-c", &src]),
    );
    k.wait_for("listening", Duration::from_secs(20));
    k
}

/// A lab of its own (`tag`) with the echo server on b:`port`.
fn lab_and_echo(tag: &str, port: u16) -> (ScopedLab, Kid) {
    let lab = lab(tag);
    let srv = echo_server(&lab, port);
    (lab, srv)
}

/// Python: `bpf()` counts this process's BPF object fds (links, programs,
/// maps: /proc/self/fd), `echo(tag)` makes one connection to b:PORT
/// (argv[1]), sends `tag` and prints what came back.
const LIB_PY: &str = r#"
import os, socket, sys
PORT = int(sys.argv[1])
def bpf():
    n = 0
    for f in os.listdir('/proc/self/fd'):
        try:
            if 'bpf-' in os.readlink('/proc/self/fd/' + f):
                n += 1
        except OSError:
            pass
    return n
def echo(tag):
    s = socket.create_connection(('198.18.0.2', PORT), 10)
    s.sendall(tag.encode())
    got = b''
    while len(got) < len(tag):
        d = s.recv(100)
        if not d:
            break
        got += d
    s.close()
    print('echo', got.decode(), flush=True)
"#;

fn py(body: &str) -> String {
    format!("{LIB_PY}\n{body}")
}

/// `python3 -c SRC PORT` under run in host a (log level info), traced by
/// strace (bpf and execve calls): (output, trace lines).
fn traced(lab: &ScopedLab, run_args: &[&str], src: &str, port: u16) -> (String, Vec<String>) {
    assert!(have("strace"), "strace is needed for this test");
    let trace = scratch(&format!("prestart-{port}-{}.strace", run_args.len()));
    let t = trace.to_str().unwrap();
    let p = port.to_string();
    let mut argv = vec![
        "strace",
        "-f",
        "-qq",
        "-o",
        t,
        "-e",
        "trace=bpf,execve,prctl",
        nanowire(),
        "run",
    ];
    argv.extend_from_slice(run_args);
    argv.extend_from_slice(&["--", python(), "-c", src, &p]);
    let mut cmd = plain_in(lab, Host::A, &argv);
    cmd.env("NANOWIRE_LOG", "info");
    let out = output(cmd, "python under run, traced");
    (out, lines_of(&trace))
}

/// The trace's lines before and after the exec of python (the launcher's
/// and the program's): the last exec of the traced process that succeeded
/// (the first is the launcher's own).
fn split_at_exec(lines: &[String]) -> (&[String], &[String]) {
    let main = lines
        .first()
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or("")
        .to_string();
    let i = lines
        .iter()
        .rposition(|l| {
            l.starts_with(&format!("{main} ")) && l.contains("execve(") && l.ends_with("= 0")
        })
        .unwrap_or_else(|| panic!("no exec of python3 in:\n{}", lines.join("\n")));
    lines.split_at(i)
}

/// Connections to b:`port` the shim put on the engine (log level info).
fn on_engine_count(out: &str, port: u16) -> usize {
    out.matches(&format!("-> {B}:{port}: xdp")).count()
}

fn count(lines: &[String], pat: &str) -> usize {
    lines.iter().filter(|l| l.contains(pat)).count()
}

/// Under run (default: prestart on) the program's first TCP connect is on
/// the engine with the steering program the launcher attached: the program
/// itself loads no program, makes no link and zeroes no UMEM after the exec
/// (the launcher did, once), it only asks the kernel what its fds are. With `-o
/// prestart=0` the program loads and links its own after the exec, as
/// before. The variable is gone from the program's environment.
#[test]
#[ignore = "needs root"]
fn the_first_connect_is_on_the_engine_with_the_program_run_attached_before_exec() {
    let (lab, _srv) = lab_and_echo("pa", 7301);
    let src = py(
        "print('env', os.environ.get('NANOWIRE_PREPARED', 'none'), flush=True)\n\
         print('held', bpf() > 0, flush=True)\necho('first')\n",
    );
    let (out, lines) = traced(&lab, &[], &src, 7301);
    assert!(out.contains("echo first"), "{out}");
    assert!(
        out.contains("env none"),
        "the variable reached the program:\n{out}"
    );
    assert!(out.contains("held True"), "{out}");
    assert!(
        out.contains(&format!("-> {B}:7301: xdp")),
        "the connection is not on the engine:\n{out}"
    );
    let (before, after) = split_at_exec(&lines);
    let all = lines.join("\n");
    assert_eq!(count(before, "BPF_LINK_CREATE"), 1, "{all}");
    assert_eq!(count(after, "BPF_PROG_LOAD"), 0, "{all}");
    assert_eq!(count(after, "BPF_LINK_CREATE"), 0, "{all}");
    assert!(count(after, "BPF_OBJ_GET_INFO_BY_FD") > 0, "{all}");
    // Nor does it zero a UMEM (the launcher made the first queue's).
    assert_eq!(count(after, "\"nanowire-umem"), 0, "{all}");
    assert!(!out.contains("not adopting"), "{out}");

    // Opted out: the program's engine attaches its own.
    let (out, lines) = traced(&lab, &["-o", "prestart=0"], &src, 7301);
    assert!(
        out.contains("echo first") && out.contains("held False"),
        "{out}"
    );
    assert!(out.contains(&format!("-> {B}:7301: xdp")), "{out}");
    let (before, after) = split_at_exec(&lines);
    let all = lines.join("\n");
    assert_eq!(count(before, "BPF_LINK_CREATE"), 0, "{all}");
    assert_eq!(count(after, "BPF_LINK_CREATE"), 1, "{all}");
    assert!(count(after, "\"nanowire-umem\"") > 0, "{all}");
}

/// `sh -c 'A; B'` under run: the shell forks for A, so it gives the
/// prepared program up; A (a child with its own engine) and B (exec'd by
/// the shell) each attach their own program and connect on the engine: a
/// shell holding the link would make their attach fail (EBUSY).
#[test]
#[ignore = "needs root"]
fn a_shell_trees_children_still_get_their_own_engines() {
    let (lab, _srv) = lab_and_echo("ps", 7302);
    let src = py("echo(sys.argv[2])\n");
    let script = "\"$2\" -c \"$1\" 7302 one; \"$2\" -c \"$1\" 7302 two";
    let mut cmd = run_in(
        &lab,
        Host::A,
        &[],
        &["sh", "-c", script, "sh", &src, python()],
    );
    cmd.env("NANOWIRE_LOG", "info");
    let out = output(cmd, "a shell tree under run");
    assert!(
        out.contains("echo one") && out.contains("echo two"),
        "{out}"
    );
    assert_eq!(on_engine_count(&out, 7302), 2, "both on the engine:\n{out}");
    assert!(!out.contains("EBUSY") && !out.contains("busy"), "{out}");
}

/// A process under run that forks before its engine started gives the
/// prepared program up (neither it nor the child holds a BPF fd after the
/// fork) and its later connect attaches its own; one that forks after its
/// engine started keeps it and the child holds none of its fds (issue 20).
#[test]
#[ignore = "needs root"]
fn a_forked_child_holds_none_of_the_prepared_fds() {
    let (lab, _srv) = lab_and_echo("pf", 7303);
    let src = py("print('before', bpf(), flush=True)\n\
         pid = os.fork()\n\
         if pid == 0:\n    print('child', bpf(), flush=True)\n    os._exit(0)\n\
         os.waitpid(pid, 0)\n\
         print('parent', bpf(), flush=True)\n\
         echo('after-fork')\n\
         print('engine', bpf() > 0, flush=True)\n\
         pid = os.fork()\n\
         if pid == 0:\n    print('child2', bpf(), flush=True)\n    os._exit(0)\n\
         os.waitpid(pid, 0)\n\
         echo('parent-again')\n");
    let mut cmd = run_in(&lab, Host::A, &[], &[python(), "-c", &src, "7303"]);
    cmd.env("NANOWIRE_LOG", "info");
    let out = output(cmd, "a forking python under run");
    let num = |key: &str| -> usize {
        line_of(&out, key)
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {out}"))
    };
    assert!(num("before ") > 0, "nothing prepared:\n{out}");
    assert_eq!(num("child "), 0, "{out}");
    assert_eq!(num("parent "), 0, "{out}");
    assert_eq!(num("child2 "), 0, "{out}");
    assert!(out.contains("engine True"), "{out}");
    assert!(
        out.contains("echo after-fork") && out.contains("echo parent-again"),
        "{out}"
    );
    assert_eq!(on_engine_count(&out, 7303), 2, "{out}");
}

/// A forged description (fds that are not BPF objects: the program's own
/// stdout and stderr, and an open file above the engine's fd floor) is
/// refused with one line at the default log level; none of those files is
/// closed, and the program's engine attaches its own program.
#[test]
#[ignore = "needs root"]
fn a_forged_description_is_refused_with_one_line_and_the_program_still_works() {
    let (lab, _srv) = lab_and_echo("pg", 7304);
    let ifname = lab.iface(Host::A);
    // The index as the lab's namespace sees it.
    let idx = output(
        plain_in(
            &lab,
            Host::A,
            &["cat", &format!("/sys/class/net/{ifname}/ifindex")],
        ),
        "ifindex",
    )
    .trim()
    .to_string();
    assert!(idx.parse::<u32>().is_ok(), "an interface index: {idx:?}");
    let forged = [
        format!("{ifname},{idx},generic,0,1,2,nw_claims=2"),
        format!("{ifname},{idx},generic,0,900,901,nw_claims=902"),
    ];
    let src = py("print('file', os.fstat(900).st_size >= 0, flush=True)\n\
         echo('forged')\n");
    for f in &forged {
        // fds 900-902 open on /dev/null across the exec (a shell's
        // redirection), without close-on-exec.
        let mut cmd = plain_in(
            &lab,
            Host::A,
            &[
                "bash",
                "-c",
                "exec 900</dev/null 901</dev/null 902</dev/null; exec \"$@\"",
                "bash",
                nanowire(),
                "run",
                "-o",
                "prestart=0",
                "--",
                python(),
                "-c",
                &src,
                "7304",
            ],
        );
        cmd.env("NANOWIRE_PREPARED", f);
        let out = output(cmd, "python under run with a forged description");
        assert!(out.contains("echo forged"), "{f}: {out}");
        assert!(out.contains("file True"), "{f}: {out}");
        assert_eq!(
            out.matches("not adopting the steering program").count(),
            1,
            "{f}: one line at the default level:\n{out}"
        );
    }
}
