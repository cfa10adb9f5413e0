#!/usr/bin/env python3
"""TCP behaviour probe for differential tests (issue 11): run plainly and under
`nanowire run`, on either end, and compare the printed lines.

    tcp_parity.py server ADDR PORT      # serves the cases, prints what it saw
    tcp_parity.py client ADDR PORT      # runs the cases against it

Every case uses a new connection to PORT; the client names the case in a
fixed 16-byte header. Nothing printed depends on timing, ports or addresses
chosen by the kernel; only behaviour (data, errno names, poll/epoll bits,
TCP_INFO state, options read back). PORT+1 must have no listener.
"""
import errno, hashlib, os, select, signal, socket, struct, sys, time

HDR = 16
FILE_DATA = bytes((i * 7 + 3) & 255 for i in range(300000))


def ename(e):
    return errno.errorcode.get(e, str(e))


def out(*a):
    print(*a, flush=True)


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            break
        b += c
    return b


def read_to_eof(s):
    b = b""
    while True:
        c = s.recv(65536)
        if not c:
            return b
        b += c


def recv_hashed(s, n):
    """Up to n bytes (fewer at EOF): how many came, and their sha256."""
    h = hashlib.sha256()
    got = 0
    while got < n:
        b = s.recv(min(1 << 20, n - got))
        if not b:
            break
        h.update(b)
        got += len(b)
    return got, h


def send_hashed(s, n):
    """n random bytes: how many were sent, and their sha256."""
    h = hashlib.sha256()
    chunk = os.urandom(1 << 16)
    sent = 0
    while sent < n:
        b = chunk[: min(len(chunk), n - sent)]
        s.sendall(b)
        h.update(b)
        sent += len(b)
    return sent, h


def recv_once_then_close(s, case):
    """One recv: what it returned or its error (a reset), then close."""
    try:
        r = s.recv(100)
        out(f"{case}: recv {r!r}")
    except OSError as e:
        out(f"{case}: recv error {ename(e.errno)}")
    s.close()


def tcp_state(s):
    return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)[0]


def bits(ev):
    names = [(select.EPOLLIN, "IN"), (select.EPOLLOUT, "OUT"), (select.EPOLLRDHUP, "RDHUP"),
             (select.EPOLLHUP, "HUP"), (select.EPOLLERR, "ERR")]
    return "|".join(n for b, n in names if ev & b) or "-"


def wait_readable(s):
    p = select.poll()
    p.register(s, select.POLLIN)
    p.poll()


# ------------------------------------------------------------------ server

def serve_one(c, case):
    if case == "echo":
        for _ in range(3):
            n = struct.unpack("!I", recv_exact(c, 4))[0]
            d = recv_exact(c, n)
            c.sendall(struct.pack("!I", len(d)) + d)
        out(f"echo: 3 messages echoed; peer ip {c.getpeername()[0]}; local ip {c.getsockname()[0]}")
        c.close()
    elif case == "halfclose":
        d = read_to_eof(c)
        out(f"halfclose: read {len(d)} bytes to EOF, sha {hashlib.sha256(d).hexdigest()[:16]}")
        c.sendall(b"bye after eof")
        c.close()
    elif case == "linger0":
        assert recv_exact(c, 2) == b"go"
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        out("linger0: closing with SO_LINGER 0")
        c.close()
    elif case == "unread":
        wait_readable(c)
        out("unread: closing with unread data")
        c.close()
    elif case == "epipe":
        out("epipe: closing at once")
        c.close()
    elif case == "peek":
        c.sendall(b"hello world")
        assert recv_exact(c, 2) == b"ok"
        c.close()
    elif case == "waitall":
        for i in range(3):
            c.sendall(bytes([65 + i]) * 1000)
            time.sleep(0.05)
        assert recv_exact(c, 2) == b"ok"
        c.close()
    elif case == "edge":
        c.sendall(b"0123456789")
        assert recv_exact(c, 1) == b"m"
        c.sendall(b"abcdefghij")
        assert recv_exact(c, 2) == b"ok"
        out("edge: sent twice")
        c.close()
    elif case == "rdhup":
        c.shutdown(socket.SHUT_WR)
        d = read_to_eof(c)
        out(f"rdhup: peer closed after {len(d)} bytes")
        c.close()
    elif case == "nbconnect":
        d = read_to_eof(c)
        out(f"nbconnect: got {d!r}")
        c.close()
    elif case == "options":
        d = read_to_eof(c)
        out(f"options: got {len(d)} bytes")
        c.close()
    elif case == "files":
        # sendfile at an offset, then from the file position; the client
        # answers with the bytes back through sendfile and sendmsg
        import tempfile
        with tempfile.TemporaryFile() as f:
            f.write(FILE_DATA)
            f.flush()
            sent = 0
            while sent < 200000:
                n = os.sendfile(c.fileno(), f.fileno(), 1000 + sent, 200000 - sent)
                if n == 0:
                    break
                sent += n
            f.seek(50000)
            n2 = 0
            while n2 < 30000:
                k = os.sendfile(c.fileno(), f.fileno(), None, 30000 - n2)
                if k == 0:
                    break
                n2 += k
            out(f"files: sendfile at an offset sent {sent}, from the position {n2}, position now {f.tell()}")
        c.shutdown(socket.SHUT_WR)
        d = read_to_eof(c)
        out(f"files: got back {len(d)} bytes, sha {hashlib.sha256(d).hexdigest()[:16]}")
        c.close()
    elif case == "pipes":
        # splice(2) between the connection and pipes, both ways (under run:
        # the connection is handed over to the kernel, which splices).
        n = struct.unpack("!I", recv_exact(c, 4))[0]
        r, w = os.pipe()
        got = b""
        while len(got) < n:
            k = os.splice(c.fileno(), w, min(32768, n - len(got)))
            if k == 0:
                break
            got += os.read(r, k)
        out(f"pipes: spliced {len(got)} bytes in, sha {hashlib.sha256(got).hexdigest()[:16]}")
        sent = 0
        while sent < 40000:
            k = min(16384, 40000 - sent)
            os.write(w, FILE_DATA[sent:sent + k])
            m = 0
            while m < k:
                m += os.splice(r, c.fileno(), k - m)
            sent += k
        out(f"pipes: spliced {sent} bytes out")
        c.shutdown(socket.SHUT_WR)
        out(f"pipes: then {len(read_to_eof(c))} bytes to EOF")
        c.close()
    elif case == "bulk":
        n = struct.unpack("!Q", recv_exact(c, 8))[0]
        got, h = recv_hashed(c, n)
        c.sendall(h.digest())
        out(f"bulk: received {got} bytes")
        # and the other way: N bytes, then their digest
        sent, h = send_hashed(c, n)
        c.sendall(h.digest())
        out(f"bulk: sent {sent} bytes")
        c.close()
    else:
        out(f"unknown case {case!r}")
        c.close()


def server(addr, port):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(16)
    out(f"listening")
    while True:
        c, _ = ls.accept()
        case = recv_exact(c, HDR).rstrip(b" ").decode()
        if case == "quit":
            out("quit")
            return
        serve_one(c, case)


# ------------------------------------------------------------------ client

def conn(addr, port, case, extra=b""):
    s = socket.create_connection((addr, port))
    s.sendall(case.encode().ljust(HDR) + extra)
    return s


def client(addr, port):
    # echo, getpeername/getsockname, TCP_INFO
    s = conn(addr, port, "echo")
    out(f"echo: peer {s.getpeername()[0]}; local ip {s.getsockname()[0]}; tcp state {tcp_state(s)}")
    for n in (1, 1400, 70000):
        d = os.urandom(n)
        s.sendall(struct.pack("!I", n) + d)
        m = struct.unpack("!I", recv_exact(s, 4))[0]
        r = recv_exact(s, m)
        out(f"echo: {n} bytes back {'same' if r == d else 'DIFFERENT'}")
    out(f"echo: then {read_to_eof(s)!r} (EOF); tcp state {tcp_state(s)}")
    s.close()

    # half-close
    s = conn(addr, port, "halfclose")
    d = bytes(range(256)) * 40
    s.sendall(d)
    s.shutdown(socket.SHUT_WR)
    out(f"halfclose: sent {len(d)}, sha {hashlib.sha256(d).hexdigest()[:16]}; reply {read_to_eof(s)!r}")
    s.close()

    # SO_LINGER 0 on the peer: ECONNRESET
    s = conn(addr, port, "linger0")
    s.sendall(b"go")
    recv_once_then_close(s, "linger0")

    # close with unread data: RST
    s = conn(addr, port, "unread", b"x" * 100)
    recv_once_then_close(s, "unread")

    # no listener: ECONNREFUSED
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.connect((addr, port + 1))
        out("refused: connected?!")
    except OSError as e:
        out(f"refused: connect error {ename(e.errno)}")
    s.close()

    # write after the peer closed: EPIPE (and SIGPIPE without MSG_NOSIGNAL)
    # The peer only closed (we are in CLOSE-WAIT): the first send is
    # accepted and the peer answers it with a reset. The probe waits for
    # the reset to be there (poll: ERR|HUP; no fixed time, whatever the
    # load), then sends again.
    s = conn(addr, port, "epipe")
    out(f"epipe: read {read_to_eof(s)!r} (EOF); tcp state {tcp_state(s)}")
    try:
        out(f"epipe: send after EOF: {s.send(b'z' * 10, socket.MSG_NOSIGNAL)}")
    except OSError as e:
        out(f"epipe: send after EOF error {ename(e.errno)}")
    # The kernel's tcp_poll reads the state before sk_err while a reset
    # being taken in (on another CPU) writes sk_err before the state: a
    # poll that runs just then sees ERR without HUP. A plain peer's reset
    # is taken in within our own send's softirq, before poll; an engine's
    # comes from another CPU. So: wait for the first event, then give the
    # reset a moment to settle (HUP follows within microseconds); what is
    # printed is the settled mask.
    p = select.poll()
    p.register(s, 0)
    ev = p.poll(60000)
    for _ in range(100):
        if not ev or any(e & select.POLLHUP for _, e in ev):
            break
        time.sleep(0.01)
        ev = p.poll(0)
    out(f"epipe: the peer's reset: poll {'|'.join(bits(e) for _, e in ev) or 'timed out'}")
    errs = []
    try:
        s.send(b"z" * 10, socket.MSG_NOSIGNAL)
    except OSError as e:
        errs.append(ename(e.errno))
    out(f"epipe: send after the reset: error {errs}")
    got = []
    signal.signal(signal.SIGPIPE, lambda *_: got.append(1))
    try:
        s.send(b"z")
        out("epipe: send ok?!")
    except OSError as e:
        out(f"epipe: send without MSG_NOSIGNAL: {ename(e.errno)}, SIGPIPE {len(got)}")
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    s.close()

    # non-blocking connect + poll + SO_ERROR, to a listener and to no listener
    for target, name in ((port, "listener"), (port + 1, "no listener")):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        r = s.connect_ex((addr, target))
        p = select.poll()
        p.register(s, select.POLLOUT)
        ev = p.poll(10000)
        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        out(f"nbconnect {name}: connect_ex {ename(r)}; polled {len(ev)}; SO_ERROR {ename(err) if err else 0}")
        if err == 0:
            s.setblocking(True)
            s.sendall(b"nbconnect".ljust(HDR) + b"hi there")
            s.shutdown(socket.SHUT_WR)
            read_to_eof(s)
        s.close()

    # MSG_PEEK
    s = conn(addr, port, "peek")
    wait_readable(s)
    while len(s.recv(64, socket.MSG_PEEK)) < 11:
        time.sleep(0.01)
    out(f"peek: {s.recv(5, socket.MSG_PEEK)!r} then {recv_exact(s, 11)!r}")
    s.sendall(b"ok")
    s.close()

    # MSG_WAITALL across three segments sent 50 ms apart
    s = conn(addr, port, "waitall")
    r = s.recv(3000, socket.MSG_WAITALL)
    out(f"waitall: {len(r)} bytes, {r[0:1]}{r[1000:1001]}{r[2000:2001]}")
    s.sendall(b"ok")
    s.close()

    # EPOLLET: data arriving while the fd is still readable is a new edge
    s = conn(addr, port, "edge")
    while len(s.recv(64, socket.MSG_PEEK)) < 10:
        time.sleep(0.01)
    ep = select.epoll()
    ep.register(s.fileno(), select.EPOLLIN | select.EPOLLET)
    ev = ep.poll(10)
    out(f"edge: first wait {bits(ev[0][1]) if ev else 'timeout'}; read {s.recv(5)!r}")
    ev = ep.poll(0.2)
    out(f"edge: wait without new data {bits(ev[0][1]) if ev else 'nothing'}")
    s.sendall(b"m")
    ev = ep.poll(10)
    out(f"edge: wait after more data {bits(ev[0][1]) if ev else 'timeout'}")
    while len(s.recv(64, socket.MSG_PEEK)) < 15:
        time.sleep(0.01)
    out(f"edge: then {recv_exact(s, 15)!r}")
    s.sendall(b"ok")
    ep.close()
    s.close()

    # epoll: RDHUP when the peer shuts down writing, HUP once both are shut
    s = conn(addr, port, "rdhup")
    ep = select.epoll()
    ep.register(s.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
    ev = ep.poll(10)
    out(f"rdhup: epoll after peer FIN {bits(ev[0][1]) if ev else 'timeout'}; tcp state {tcp_state(s)}")
    out(f"rdhup: recv {s.recv(10)!r}")
    s.sendall(b"abc")
    s.shutdown(socket.SHUT_WR)
    while True:
        ev = ep.poll(10)
        if ev and ev[0][1] & select.EPOLLHUP:
            break
        time.sleep(0.01)
    out(f"rdhup: epoll after both FINs {bits(ev[0][1])}")
    ep.close()
    s.close()

    # options read back
    s = conn(addr, port, "options")
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
    out("options: nodelay {} keepalive {} keepidle {} type {} info state {}".format(
        s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY),
        s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
        s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
        s.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE), tcp_state(s)))
    s.sendall(b"o" * 10)
    s.shutdown(socket.SHUT_WR)
    read_to_eof(s)
    s.close()

    # small SO_RCVBUF/SO_SNDBUF set before connect (under run they size the engine's rings)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
    s.connect((addr, port))
    n = 1 << 20
    s.sendall(b"bulk".ljust(HDR) + struct.pack("!Q", n))
    blk = bytes(range(256)) * 256
    h = hashlib.sha256()
    for i in range(n // len(blk)):
        s.sendall(blk)
        h.update(blk)
    ok1 = recv_exact(s, 32) == h.digest()
    h, got = hashlib.sha256(), 0
    while got < n:
        b = s.recv(min(65536, n - got))
        if not b:
            break
        h.update(b)
        got += len(b)
    ok2 = recv_exact(s, 32) == h.digest()
    out(f"smallbuf: rcvbuf {s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)} sndbuf "
        f"{s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)}; 1 MiB each way, digests {ok1} {ok2}")
    s.close()

    # sendfile and sendmsg with several buffers
    s = conn(addr, port, "files")
    d = read_to_eof(s)
    want = FILE_DATA[1000:201000] + FILE_DATA[50000:80000]
    out(f"files: got {len(d)} bytes; {'matches' if d == want else 'DIFFERS'}")
    import tempfile
    with tempfile.TemporaryFile() as f:
        f.write(d)
        f.flush()
        n = s.sendfile(f, offset=0, count=70000)
        out(f"files: socket.sendfile sent {n}, position {f.tell()}")
    n = s.sendmsg([b"a" * 1000, b"b" * 2000, b"c" * 3])
    out(f"files: sendmsg sent {n}")
    s.close()

    # splice(2) between the connection and pipes, both ways
    n = 100000
    s = conn(addr, port, "pipes", struct.pack("!I", n))
    r, w = os.pipe()
    sent = 0
    while sent < n:
        k = min(16384, n - sent)
        os.write(w, FILE_DATA[sent:sent + k])
        m = 0
        while m < k:
            m += os.splice(r, s.fileno(), k - m)
        sent += k
    got = b""
    while True:
        k = os.splice(s.fileno(), w, 32768)
        if k == 0:
            break
        got += os.read(r, k)
    want = FILE_DATA[:40000]
    out(f"pipes: spliced {sent} out, {len(got)} in; {'matches' if got == want else 'DIFFERS'}")
    s.close()

    # a bulk stream, hashed (NANOWIRE_TCP_STREAM_MIB, default 4)
    n = int(os.environ.get("NANOWIRE_TCP_STREAM_MIB", "4")) << 20
    s = conn(addr, port, "bulk", struct.pack("!Q", n))
    sent, h = send_hashed(s, n)
    r = recv_exact(s, 32)
    out(f"bulk: sent {sent} bytes; digest {'matches' if r == h.digest() else 'DIFFERS'}")
    got, h = recv_hashed(s, n)
    r = recv_exact(s, 32)
    out(f"bulk: received {got} bytes; digest {'matches' if r == h.digest() else 'DIFFERS'}")
    s.close()

    s = conn(addr, port, "quit")
    s.close()
    out("done")


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    role, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    (server if role == "server" else client)(addr, port)
