# Connects, sends one answer of 1,000 bytes and dies by SIGKILL right
# after it: plainly by its own kill, under run already inside the send,
# right after the frame's TX kick (the engine's test hook
# NANOWIRE_TEST_KILL_AFTER_SEND=1), the moment a connection table not yet
# written for the answer would end the stream before it.
import os, signal, socket, sys, time

addr, port = sys.argv[1], int(sys.argv[2])
c = socket.socket()
c.connect((addr, port))
print("connected", flush=True)
# On an engine of its own the warden (which ends a killed process's
# connections) is started off the application's path and can still be on
# its way for the first milliseconds of the first connection (a limit in
# docs/robustness.md): the death this test is about comes once it runs.
if os.environ.get("LD_PRELOAD") and os.environ.get("NANOWIRE_SERVICE") != "1":
    me = f"--pid {os.getpid()} ".encode()
    for _ in range(1000):
        found = False
        for d in os.listdir("/proc"):
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ")
            except OSError:
                continue
            if b"engine warden" in cmd and me in cmd + b" ":
                found = True
                break
        if found:
            break
        time.sleep(0.01)
    print(f"warden {'up' if found else 'not found'}", flush=True)
c.send(bytes((i * 11 + 5) & 0xFF for i in range(1000)))
os.kill(os.getpid(), signal.SIGKILL)
