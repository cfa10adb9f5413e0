"""UDP echo servers for the shim tests: a plain socket one and an asyncio one.

usage: udp_echo.py blocking|timeout|asyncio ADDR PORT
Prints 'ready' once bound; echoes every datagram to its sender; exits on
a datagram b'quit'.
"""
import asyncio
import socket
import sys

mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])

if mode == "asyncio":
    class Echo(asyncio.DatagramProtocol):
        def __init__(self, done):
            self.done = done

        def connection_made(self, transport):
            self.t = transport

        def datagram_received(self, data, peer):
            if data == b"quit":
                self.done.set_result(True)
                return
            self.t.sendto(data, peer)

    async def main():
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        t, _ = await loop.create_datagram_endpoint(lambda: Echo(done), local_addr=(addr, port))
        print("ready", flush=True)
        await asyncio.wait_for(done, 120)
        t.close()

    asyncio.run(main())
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, port))
    if mode == "timeout":
        # Python then uses a non-blocking fd and poll() before each recv.
        s.settimeout(120)
    print("ready", flush=True)
    while True:
        data, peer = s.recvfrom(65535)
        if data == b"quit":
            break
        s.sendto(data, peer)
