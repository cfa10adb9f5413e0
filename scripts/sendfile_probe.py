#!/usr/bin/env python3
"""sendfile and splice on a TCP connection (issue 21 item 4): the same
program plainly and under `nanowire run`.

  server ADDR PORT FILE sendfile   one connection: socket.sendfile(FILE)
  server ADDR PORT FILE splice     one connection: FILE -> pipe -> os.splice
                                   into the socket
  server ADDR PORT - splice-in     one connection: os.splice from the socket
                                   into a pipe, hashed: prints "in SHA LEN"
  client ADDR PORT                 reads to EOF: prints "got SHA LEN"
  client-send ADDR PORT FILE       sends FILE, half-closes, waits for EOF
"""
import hashlib
import os
import socket
import sys
import threading


def serve(addr, port, path, mode):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(4)
    print("listening", flush=True)
    c, _ = ls.accept()
    if mode == "sendfile":
        with open(path, "rb") as f:
            n = c.sendfile(f)
        print("sent", n, flush=True)
    elif mode == "splice":
        r, w = os.pipe()

        def feed():
            with open(path, "rb") as f:
                while True:
                    b = f.read(1 << 16)
                    if not b:
                        break
                    os.write(w, b)
            os.close(w)

        th = threading.Thread(target=feed)
        th.start()
        n = 0
        while True:
            k = os.splice(r, c.fileno(), 1 << 20)
            if k == 0:
                break
            n += k
        th.join()
        print("sent", n, flush=True)
    elif mode == "splice-in":
        r, w = os.pipe()
        h = hashlib.sha256()
        total = [0]

        def drain():
            while True:
                b = os.read(r, 1 << 16)
                if not b:
                    break
                h.update(b)
                total[0] += len(b)

        th = threading.Thread(target=drain)
        th.start()
        while True:
            k = os.splice(c.fileno(), w, 1 << 20)
            if k == 0:
                break
        os.close(w)
        th.join()
        print("in", h.hexdigest(), total[0], flush=True)
    c.close()


def main():
    mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "server":
        serve(addr, port, sys.argv[4], sys.argv[5])
    elif mode == "client":
        s = socket.create_connection((addr, port), timeout=60)
        h = hashlib.sha256()
        n = 0
        while True:
            b = s.recv(1 << 16)
            if not b:
                break
            h.update(b)
            n += len(b)
        print("got", h.hexdigest(), n, flush=True)
    elif mode == "client-send":
        s = socket.create_connection((addr, port), timeout=60)
        with open(sys.argv[4], "rb") as f:
            s.sendfile(f)
        s.shutdown(socket.SHUT_WR)
        s.recv(1)
        print("done", flush=True)


if __name__ == "__main__":
    main()
