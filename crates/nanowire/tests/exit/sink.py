# A plain TCP sink: accepts one connection, reads to EOF (or a 20 s silence)
# and prints how many bytes came, their SHA-256, and how the stream ended.
import hashlib, socket, sys, time

addr, port, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
# A small receive buffer: the writer's last bytes are still in flight when it exits.
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
s.bind((addr, port))
s.listen(1)
print("ready", flush=True)
c, _ = s.accept()
c.settimeout(20)
time.sleep(delay)
h, n = hashlib.sha256(), 0
try:
    while True:
        b = c.recv(65536)
        if not b:
            print(f"EOF {n} {h.hexdigest()}", flush=True)
            break
        h.update(b)
        n += len(b)
except OSError as e:
    print(f"ended by {type(e).__name__} after {n} {h.hexdigest()}", flush=True)
