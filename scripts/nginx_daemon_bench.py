#!/usr/bin/env python3
"""nginx as it runs by default (`daemon on`: the first process makes the listener, forks the master
and exits; 2 workers, as root: as nobody a worker attaching while the root first process is still
attached is refused by the service's trust groups), answering `return 200` on a new connection per request: `ab -n N
-c 20` from host a, requests per second. Plainly, under run on the engine service with this tree's
shim and `nanowire`, and with another build's (`--before SHIM --before-bin NANOWIRE`), interleaved.
Before session 29 the first process's exit ended the listener's group on the service and the
workers accepted from the kernel's listener:

    scripts/nginx_daemon_bench.py --before /work/bench29/prev.so --before-bin /work/bench29/prev-nanowire

Every `nanowire engine serve` of the host is killed before each run row (run it on a quiet machine).
The JSON (stdout) has the environment, every repeat, the medians and the ratios.
"""
import argparse, json, os, statistics, subprocess, tempfile, time
from rowlib import env_of, in_b, interleave, row_argv

CONF = """worker_processes 2;
user root;
pid {d}/nginx.pid;
error_log {d}/error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fcgi;
  uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
  server {{ listen 198.18.0.2:{port}; location / {{ return 200 "daemon\\n"; }} }}
}}
"""


def one(row, a, port):
    d = tempfile.mkdtemp(prefix="nw-ngxd-")
    os.chmod(d, 0o755)
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write(CONF.format(d=d, port=port[0]))
    if row != "plain":
        subprocess.run(["pkill", "-f", "engine serve"], stderr=subprocess.DEVNULL)
        time.sleep(0.5)
    argv = row_argv(row, ["nginx", "-p", d, "-c", conf], a)
    subprocess.run(in_b(argv), check=True, capture_output=True, timeout=60)
    time.sleep(0.5)
    url = f"http://198.18.0.2:{port[0]}/"
    ab = ["ip", "netns", "exec", "nw-a", "ab", "-q", "-n", str(a.n), "-c", "20", url]
    subprocess.run(ab[:7] + ["200"] + ab[8:], capture_output=True, timeout=120)  # warm-up
    out = subprocess.run(ab, capture_output=True, text=True, timeout=300)
    master = int(open(os.path.join(d, "nginx.pid")).read())
    os.kill(master, 15)
    while os.path.exists(f"/proc/{master}"):
        time.sleep(0.05)
    port[0] += 1
    rps = [x for x in out.stdout.splitlines() if x.startswith("Requests per second")]
    failed = [x for x in out.stdout.splitlines() if x.startswith("Failed requests")]
    if not rps:
        raise RuntimeError(f"{row}: ab: {out.stdout[-500:]} {out.stderr[-500:]}")
    return float(rps[0].split()[3]), int(failed[0].split()[2]) if failed else -1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="the other build's shim (libnanowire_preload.so)")
    p.add_argument("--before-bin", help="the other build's nanowire binary; default: this tree's")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--n", type=int, default=20000)
    a = p.parse_args()
    a.engine = "service"
    port = [8300]
    runs = interleave(a.repeats, lambda row: one(row, a, port))
    rps = {r: [x[0] for x in v] for r, v in runs.items()}
    med = {r: statistics.median(v) for r, v in rps.items()}
    print(json.dumps({
        "env": env_of(a, engine="service"), "n": a.n, "repeats": a.repeats,
        "req_s": rps, "failed": {r: [x[1] for x in v] for r, v in runs.items()},
        "median_req_s": med,
        "ratios": {"run/plain": round(med["run"] / med["plain"], 3),
                   "run/before": round(med["run"] / med["before"], 3)},
    }, indent=1))


if __name__ == "__main__":
    main()
