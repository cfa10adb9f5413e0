import socket, sys, time
addr, port = sys.argv[1], int(sys.argv[2])
for i in range(2):
    s = socket.create_connection((addr, port))
    s.sendall(b"line %d\n" % i)
    d = b""
    while True:
        k = s.recv(100)
        if not k: break
        d += k
    print(d.decode(), end="", flush=True)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(5)
time.sleep(0.5)
u.sendto(b"one", (addr, port)); time.sleep(0.3); u.sendto(b"two", (addr, port))
for _ in range(2):
    try: print(u.recv(100).decode(), flush=True)
    except socket.timeout: print("timeout", flush=True)
