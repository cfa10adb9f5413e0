#!/usr/bin/env python3
"""Socket options that change what goes on the wire (issue 20, finding 2).

Run the same way plainly and under `nanowire run`; the outputs must match.

  udp-recv ADDR PORT           plain receiver (IP_RECVTTL, IP_RECVTOS): prints
                               "ttl=T tos=0xXX" of the first datagram
  udp-send ADDR PORT           sender with IP_TTL=7, IP_TOS=0xb8
  tcp-hdr-server ADDR PORT     listener with IP_TTL=7, IP_TOS=0xb8 set before
                               listen; prints the TTL/TOS of the client's
                               segments it captured (AF_PACKET)
  tcp-hdr-client ADDR PORT     the same on the client side
  tcp-echo-capture ADDR PORT N listener with nothing set: echoes N connections
                               and prints the TTL/TOS of the segments (SYN or
                               data) it captured from them
  tcp-default-client ADDR PORT two connections with nothing set, then one with
                               IP_TTL=9: the defaults of the namespace
                               (sysctl ip_default_ttl) until an option is set
  md5-server ADDR PORT [PEER]  listener, with a TCP_MD5SIG key for PEER if given
  md5-client ADDR PORT [KEY]   connect (3 s), with TCP_MD5SIG KEY if given:
                               "connected" + echo, or "timeout"
  minttl-server ADDR PORT before|after
                               listener with IP_MINTTL=255 set before or after
                               listen
  ttl-client ADDR PORT TTL     connect (3 s) with IP_TTL=TTL: "connected" or
                               "timeout"
  udp-pktinfo-echo ADDR PORT N
                               echo server: the first datagram plainly, then
                               IP_PKTINFO and IP_RECVTTL set (options the
                               engine does not apply: under run the socket
                               moves to the kernel) and N more, each printed
                               with its ancillary data
  udp-ping ADDR PORT N         sends N+1 datagrams, each after the echo of
                               the one before ("ping K": 3 s, else "timeout")
  ao-server ADDR PORT PEER     listener: every TCP-AO option (38-42, set and
                               get, a key for PEER) before bind, after listen
                               and on the accepted connection, each result
                               printed ("ok N" or the errno's name); echoes
  ao-client ADDR PORT          the same before connect and once connected;
                               prints the echo
"""
import ctypes
import errno
import socket
import struct
import sys
import threading
import time

TCP_MD5SIG = 14
IP_MINTTL = 21
IP_RECVTTL = 12
IP_PKTINFO = 8
KEY = b"nanowire-md5-key"


# TCP-AO (linux/tcp.h, Linux 6.7): option numbers and the structures'
# sizes; the values are real (a key for the peer, hmac(sha1)).
TCP_AO_ADD_KEY, TCP_AO_DEL_KEY, TCP_AO_INFO, TCP_AO_GET_KEYS, TCP_AO_REPAIR = range(38, 43)
LIBC = ctypes.CDLL(None, use_errno=True)


def sockaddr_storage(peer):
    sa = struct.pack("=H", socket.AF_INET) + struct.pack("!H", 0) + socket.inet_aton(peer)
    return sa + b"\0" * (128 - len(sa))


def ao_calls(state, s, peer):
    """Every TCP-AO option on s, through libc (the shim's setsockopt and
    getsockopt under run): one line each, "STATE NAME set|get: ok N" or the
    errno's name."""
    key = KEY + b"\0" * (80 - len(KEY))
    sa = sockaddr_storage(peer)
    # struct tcp_ao_add: addr, alg_name[64], ifindex, flags, reserved2,
    # prefix, sndid, rcvid, maclen, keyflags, keylen, key[80] (288 bytes).
    add = sa + b"hmac(sha1)".ljust(64, b"\0") + struct.pack(
        "=iIHBBBBBB", 0, 0, 0, 32, 100, 100, 0, 0, len(KEY)) + key
    # struct tcp_ao_info_opt: flags (ao_required), reserved2, current_key,
    # rnext, five counters (48 bytes).
    info = struct.pack("=IHBB", 4, 0, 0, 0) + b"\0" * 40
    # struct tcp_ao_getsockopt: addr, alg_name, key, nkeys, flags (get_all),
    # sndid, rcvid, prefix, maclen, keyflags, keylen, ifindex, 2 counters.
    get = sa + b"\0" * 144 + struct.pack("=IHBBBBBBi", 1, 4, 0, 0, 32, 0, 0, 0, 0) + b"\0" * 16
    # struct tcp_ao_del: addr, ifindex, flags, reserved2, prefix, sndid,
    # rcvid, current_key, rnext, keyflags (144 bytes).
    dele = sa + struct.pack("=iIHBBBBBB", 0, 0, 0, 32, 100, 100, 0, 0, 0)
    repair = b"\0" * 16
    fd = s.fileno()
    for name, opt, op, val in (
        ("TCP_AO_ADD_KEY", TCP_AO_ADD_KEY, "set", add),
        ("TCP_AO_INFO", TCP_AO_INFO, "set", info),
        ("TCP_AO_INFO", TCP_AO_INFO, "get", info),
        ("TCP_AO_GET_KEYS", TCP_AO_GET_KEYS, "get", get),
        ("TCP_AO_REPAIR", TCP_AO_REPAIR, "get", repair),
        ("TCP_AO_REPAIR", TCP_AO_REPAIR, "set", repair),
        ("TCP_AO_DEL_KEY", TCP_AO_DEL_KEY, "set", dele),
    ):
        buf = ctypes.create_string_buffer(val, len(val))
        n = ctypes.c_uint32(len(val))
        ctypes.set_errno(0)
        if op == "set":
            r = LIBC.setsockopt(fd, socket.IPPROTO_TCP, opt, buf, n)
        else:
            r = LIBC.getsockopt(fd, socket.IPPROTO_TCP, opt, buf, ctypes.byref(n))
        e = ctypes.get_errno()
        print("%s %s %s: %s" % (state, name, op,
              "ok %d" % n.value if r == 0 else errno.errorcode.get(e, str(e))), flush=True)


def say_echo(s, addr, port, msg):
    """Connect s, send msg and print what the server echoes ("connected ..."),
    or "timeout" after 3 s."""
    s.settimeout(3)
    try:
        s.connect((addr, port))
        s.sendall(msg)
        print("connected", s.recv(100).decode(), flush=True)
    except socket.timeout:
        print("timeout", flush=True)


def md5sig(peer, key):
    # struct tcp_md5sig: sockaddr_storage (128), flags, prefixlen, keylen,
    # ifindex, key[80].
    sa = struct.pack("=H", socket.AF_INET) + struct.pack("!H", 0) + socket.inet_aton(peer)
    sa += b"\0" * (128 - len(sa))
    return sa + struct.pack("=BBHi", 0, 0, len(key), 0) + key + b"\0" * (80 - len(key))


class Capture:
    """(ttl, tos) of TCP segments from `peer` that carry a SYN or data."""

    def __init__(self, peer):
        self.peer = socket.inet_aton(peer)
        self.seen = set()
        self.s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(0x0800))
        self.s.settimeout(0.2)
        self.stop = False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop:
            try:
                p = self.s.recv(65536)
            except socket.timeout:
                continue
            if len(p) < 40 or p[9] != 6 or p[12:16] != self.peer:
                continue
            ihl = (p[0] & 15) * 4
            total = struct.unpack("!H", p[2:4])[0]
            doff = (p[ihl + 12] >> 4) * 4
            syn = p[ihl + 13] & 2
            if syn or total - ihl - doff > 0:
                self.seen.add((p[8], p[1]))

    def report(self):
        time.sleep(0.3)
        self.stop = True
        self.t.join()
        return " ".join("ttl=%d tos=0x%02x" % x for x in sorted(self.seen))


def hdr(s):
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 7)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0xB8)


def main():
    mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "udp-recv":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.IPPROTO_IP, IP_RECVTTL, 1)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        s.bind((addr, port))
        s.settimeout(20)
        print("ready", flush=True)
        _, anc, _, _ = s.recvmsg(2048, 256)
        got = {t: d for (_, t, d) in anc}
        ttl = struct.unpack("=i", got[socket.IP_TTL][:4])[0]
        tos = got[socket.IP_TOS][0]
        print("ttl=%d tos=0x%02x" % (ttl, tos), flush=True)
    elif mode == "udp-send":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        hdr(s)
        for _ in range(40):
            s.sendto(b"x", (addr, port))
            time.sleep(0.05)
        print("ttl=%d tos=0x%02x" % (
            s.getsockopt(socket.IPPROTO_IP, socket.IP_TTL),
            s.getsockopt(socket.IPPROTO_IP, socket.IP_TOS)), flush=True)
    elif mode == "tcp-hdr-server":
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        hdr(ls)
        ls.bind((addr, port))
        ls.listen(4)
        print("listening", flush=True)
        c, peer = ls.accept()
        cap = Capture(peer[0])
        for _ in range(3):
            d = c.recv(100)
            c.sendall(d)
        # The accepted socket reads back what it inherited, as plainly.
        print("accepted ttl=%d tos=0x%02x" % (
            c.getsockopt(socket.IPPROTO_IP, socket.IP_TTL),
            c.getsockopt(socket.IPPROTO_IP, socket.IP_TOS)))
        print("seen", cap.report(), flush=True)
        c.close()
    elif mode == "tcp-hdr-client":
        cap = Capture(addr)
        s = socket.socket()
        hdr(s)
        s.settimeout(10)
        s.connect((addr, port))
        for i in range(3):
            s.sendall(b"hello %d" % i)
            s.recv(100)
            time.sleep(0.1)
        print("seen", cap.report(), flush=True)
        s.close()
    elif mode == "tcp-echo-capture":
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((addr, port))
        ls.listen(8)
        cap = Capture(sys.argv[5])
        print("listening", flush=True)
        for _ in range(int(sys.argv[4])):
            c, _ = ls.accept()
            c.sendall(c.recv(100))
            c.close()
        print("seen", cap.report(), flush=True)
    elif mode == "tcp-default-client":
        for ttl in (None, None, 9):
            s = socket.socket()
            if ttl:
                s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
            say_echo(s, addr, port, b"hdr")
            s.close()
    elif mode == "md5-server":
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if len(sys.argv) > 4:
            ls.setsockopt(socket.IPPROTO_TCP, TCP_MD5SIG, md5sig(sys.argv[4], KEY))
        ls.bind((addr, port))
        ls.listen(4)
        ls.settimeout(15)
        print("listening", flush=True)
        try:
            c, _ = ls.accept()
            c.sendall(c.recv(100))
            c.close()
            print("accepted", flush=True)
        except socket.timeout:
            print("nothing accepted", flush=True)
    elif mode == "md5-client":
        s = socket.socket()
        if len(sys.argv) > 4:
            s.setsockopt(socket.IPPROTO_TCP, TCP_MD5SIG, md5sig(addr, sys.argv[4].encode()))
        say_echo(s, addr, port, b"signed")
    elif mode == "minttl-server":
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if sys.argv[4] == "before":
            ls.setsockopt(socket.IPPROTO_IP, IP_MINTTL, 255)
        ls.bind((addr, port))
        ls.listen(4)
        if sys.argv[4] == "after":
            ls.setsockopt(socket.IPPROTO_IP, IP_MINTTL, 255)
        print("listening minttl=%d" % ls.getsockopt(socket.IPPROTO_IP, IP_MINTTL), flush=True)
        ls.settimeout(15)
        n = 0
        while n < 1:
            try:
                c, _ = ls.accept()
            except socket.timeout:
                break
            c.settimeout(5)
            c.sendall(c.recv(100))
            c.close()
            n += 1
        print("accepted %d" % n, flush=True)
    elif mode == "ttl-client":
        s = socket.socket()
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, int(sys.argv[4]))
        say_echo(s, addr, port, b"ttl ok")
    elif mode == "udp-pktinfo-echo":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((addr, port))
        s.settimeout(20)
        print("ready", flush=True)
        d, peer = s.recvfrom(2048)
        print("first", d.decode(), flush=True)
        s.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        s.setsockopt(socket.IPPROTO_IP, IP_RECVTTL, 1)
        s.sendto(d, peer)
        for _ in range(int(sys.argv[4])):
            d, anc, _, peer = s.recvmsg(2048, 256)
            cm = []
            for level, t, v in anc:
                if t == IP_PKTINFO:
                    ifx, spec, dst = struct.unpack("=i4s4s", v[:12])
                    cm.append("pktinfo if=%s spec_dst=%s addr=%s" % (
                        socket.if_indextoname(ifx) if ifx else 0,
                        socket.inet_ntoa(spec), socket.inet_ntoa(dst)))
                elif t == socket.IP_TTL:
                    cm.append("ttl=%d" % struct.unpack("=i", v[:4])[0])
                else:
                    cm.append("cmsg %d/%d" % (level, t))
            print(d.decode(), peer[0], " ".join(cm), flush=True)
            s.sendto(d, peer)
    elif mode == "udp-ping":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(3)
        for k in range(int(sys.argv[4]) + 1):
            s.sendto(b"ping %d" % k, (addr, port))
            try:
                print(s.recv(100).decode(), flush=True)
            except socket.timeout:
                print("timeout", flush=True)
                break
    elif mode == "ao-server":
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ao_calls("unconnected", ls, sys.argv[4])
        ls.bind((addr, port))
        ls.listen(4)
        ao_calls("listening", ls, sys.argv[4])
        ls.settimeout(15)
        print("listening", flush=True)
        c, _ = ls.accept()
        c.settimeout(10)
        ao_calls("accepted", c, sys.argv[4])
        c.sendall(c.recv(100))
        c.close()
        print("accepted", flush=True)
    elif mode == "ao-client":
        s = socket.socket()
        ao_calls("unconnected", s, addr)
        s.settimeout(10)
        s.connect((addr, port))
        ao_calls("connected", s, addr)
        s.sendall(b"ao")
        print("echo", s.recv(100).decode(), flush=True)
        s.close()
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main()
