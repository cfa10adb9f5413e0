//! Listening sockets that cross fork (issue 24): nginx with a master and
//! 2 or 4 workers, plainly and under `nanowire run` on the engine service
//! (`NANOWIRE_SERVICE=1`). The master listens and forks; each worker
//! attaches to the service with its own slot, proves it holds the same
//! listening socket, and joins the listener's group: new connections are
//! spread over the workers (steer.c `group_owner`). A client in host a
//! fetches N bodies, each on a new connection; the bodies' hashes must be
//! the same plainly and under run, and under run the workers' engines
//! must show the connections (`tcp_passive_opens`) in more than one
//! worker, none in the master.

mod run_support;
use nanowire_lab::testbed::{ADDR_B, Host, ScopedLab};
use run_support::*;
use std::time::{Duration, Instant};

const PORT: u16 = 8090;
const FETCHES: usize = 48;

const CLIENT: &str = r#"
import hashlib, http.client, sys
n = int(sys.argv[2]); names = sys.argv[3:]
for i in range(n):
    c = http.client.HTTPConnection(sys.argv[1], 8090, timeout=30)
    name = names[i % len(names)]
    c.request("GET", "/" + name)
    r = c.getresponse()
    b = r.read()
    print(name, r.status, len(b), hashlib.sha256(b).hexdigest(), flush=True)
    c.close()
"#;

fn nginx(lab: &ScopedLab, dir: &std::path::Path, workers: usize, run: bool) -> Kid {
    let d = dir.display();
    let conf = dir.join(format!("nginx-{run}.conf"));
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process on;\nworker_processes {workers};\nuser root;\n\
             pid {d}/nginx-{run}.pid;\nerror_log stderr warn;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n  access_log off;\n  sendfile on;\n  keepalive_timeout 65;\n\
             client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fcgi;\n\
             uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
             default_type application/octet-stream;\n\
             server {{ listen {ADDR_B}:{PORT}; root {d}/www; }}\n}}\n"
        ),
    )
    .unwrap();
    let conf = conf.to_string_lossy().into_owned();
    let prefix = dir.to_string_lossy().into_owned();
    let argv = ["nginx", "-p", &prefix, "-c", &conf, "-e", "stderr"];
    let mut cmd = if run {
        run_in(lab, Host::B, &["--engine", "xdp"], &argv)
    } else {
        plain_in(lab, Host::B, &argv)
    };
    cmd.env("NANOWIRE_SERVICE", "1")
        .env("NANOWIRE_LOG", "info")
        .env("NANOWIRE_SPIN_US", "0")
        .env("NANOWIRE_RING_DEPTH", "1024");
    let k = spawn(&format!("nginx{workers}-{run}"), cmd);
    // Serving once a request through every worker's start is answered.
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let ok = plain_in(
            lab,
            Host::A,
            &[
                "curl",
                "-sS",
                "-o",
                "/dev/null",
                "--max-time",
                "5",
                &format!("http://{ADDR_B}:{PORT}/f0.bin"),
            ],
        )
        .output()
        .is_ok_and(|o| o.status.success());
        if ok {
            break;
        }
        assert!(Instant::now() < end, "nginx did not serve:\n{}", k.both());
        std::thread::sleep(Duration::from_millis(200));
    }
    k
}

/// SIGTERM to the master (it stops its workers), then wait.
fn stop(mut k: Kid) -> String {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(k.child.id() as i32, libc::SIGTERM) };
    k.wait(Duration::from_secs(30));
    k.both()
}

fn fetch(lab: &ScopedLab, names: &[String]) -> String {
    let n = FETCHES.to_string();
    let mut argv = vec!["python3", "-c", CLIENT, "198.18.0.2", n.as_str()];
    argv.extend(names.iter().map(String::as_str));
    let o = plain_in(lab, Host::A, &argv).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "client failed:\n{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

fn nginx_workers_share_the_listener(workers: usize) {
    nanowire_testkit::require(&["nginx", "python3", "curl"]);
    let lab = lab(&format!("fk{workers}"));
    let dir = scratch(&format!("fork{workers}"));
    std::fs::create_dir_all(dir.join("www")).unwrap();
    let mut names = Vec::new();
    for i in 0..6 {
        let name = format!("f{i}.bin");
        let body: Vec<u8> = (0..(20_000 + i * 37_001))
            .map(|j| (j * 31 + i * 7) as u8)
            .collect();
        std::fs::write(dir.join("www").join(&name), body).unwrap();
        names.push(name);
    }
    let plain = nginx(&lab, &dir, workers, false);
    let want = fetch(&lab, &names);
    stop(plain);
    assert_eq!(want.lines().count(), FETCHES, "{want}");
    assert!(want.lines().all(|l| l.contains(" 200 ")), "{want}");

    let srv = nginx(&lab, &dir, workers, true);
    let got = fetch(&lab, &names);
    let engines = nanowire_testkit::engines_on(nanowire(), &lab.iface(Host::B));
    let opens: Vec<u64> = engines
        .iter()
        .map(|e| e["counters"]["tcp_passive_opens"].as_u64().unwrap_or(0))
        .collect();
    let log = stop(srv);
    assert_same_output("nginx bodies", &want, &got, &log);
    let serving = opens.iter().filter(|&&n| n > 0).count();
    assert!(
        serving >= 2,
        "connections on the engine in {serving} process(es) only: {opens:?}\n{log}"
    );
    assert_eq!(
        log.matches("shared with the parent process through the engine service")
            .count(),
        workers,
        "{log}"
    );
    assert!(!log.contains("back on the kernel"), "{log}");
}

#[test]
#[ignore = "needs root"]
fn nginx_with_two_workers_serves_on_the_engine_in_each_worker() {
    nginx_workers_share_the_listener(2);
}

#[test]
#[ignore = "needs root"]
fn nginx_with_four_workers_serves_on_the_engine_in_each_worker() {
    nginx_workers_share_the_listener(4);
}
