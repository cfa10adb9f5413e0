import socket, sys, time
proto, addr, port, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
end = time.time() + secs
got = b""
if proto == "udp":
    # Everything up to the test's END datagram, which it sends once the
    # program has exited (secs only bounds a lost END).
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, port))
    print("ready", flush=True)
    while time.time() < end:
        s.settimeout(max(0.01, end - time.time()))
        try:
            d = s.recv(65536)
        except socket.timeout:
            got += b"<no END>"
            break
        if d == b"<END>":
            break
        got += d
else:
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port)); ls.listen(4)
    print("ready", flush=True)
    ls.settimeout(secs)
    c, _ = ls.accept()
    while time.time() < end:
        c.settimeout(max(0.01, end - time.time()))
        try:
            k = c.recv(65536)
        except socket.timeout:
            break
        except ConnectionResetError:
            got += b"<reset>"; break
        if not k:
            got += b"<eof>"; break
        got += k
print("peer got", got, flush=True)
