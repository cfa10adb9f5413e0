#!/usr/bin/env python3
"""Instructions per path of the steering program (bpf/steer.c), counted exactly.

Runs the compiled BPF object's program (as clang emitted it, before the verifier) in a small
interpreter on one packet per path, with the maps filled as scripts/steer-ab/steer_ab.c fills them
(our MAC 02:00:00:00:00:01, MTU 1500, UDP claims 198.18.0.1:5000 (a pid), :5002 (NW_SLOT | 3),
239.1.1.1:5000, TCP listener 198.18.0.1:80, TCP flow .2:40000 -> .1:5001, a flow passed to the
kernel .2:40001 -> .1:80, a listener group 198.18.0.1:8080 (issue 24: group 1, slot 3), AF_XDP sockets at keys 0 and 3 * 64), and prints per packet: the
verdict, the BPF instructions executed and the helper calls made. Load does not matter: nothing is
timed. The kernel's verifier then inlines array-map lookups (a call becomes ~4 instructions) and
adds ~2 instructions after a hash-map lookup's call (xlated counts are a little higher).

    clang -O2 -g -target bpf -I/usr/include/x86_64-linux-gnu -c bpf/steer.c -o /tmp/steer.o
    scripts/steer-ab/paths.py /tmp/steer.o [/tmp/other.o ...] [--prog nw_steer_frags]
    scripts/steer-ab/paths.py --emit | steer_ab A.o B.o    # the same packets, timed (steer_ab.c)
"""
import argparse
import ipaddress
import struct
import sys

M64 = (1 << 64) - 1

# Key and value sizes of the maps the program may name (by map name).
MAPS = {
    "nw_claims": (8, 4),
    "nw_tcp_listen": (8, 4),
    "nw_tcp_flows": (12, 4),
    "nw_tcp_frags": (12, 4),
    "nw_tcp_groups": (4, 80),
    "nw_tcp_pins": (12, 4),
    "nw_config": (4, 12),
    "nw_stats": (4, 8),
    "nw_xsks": (4, 4),
    "nw_ready": (4, 4),
}
HELPERS = {1: "map_lookup_elem", 2: "map_update_elem", 3: "map_delete_elem", 51: "redirect_map",
           163: "check_mtu"}
ACTIONS = ["ABORTED", "DROP", "PASS", "TX", "REDIRECT"]


def elf_sections(data):
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    secs = []
    for i in range(shnum):
        f = struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
        secs.append({"name_off": f[0], "type": f[1], "offset": f[4], "size": f[5], "link": f[6],
                     "info": f[7], "entsize": f[9]})
    strtab = secs[shstrndx]
    for s in secs:
        o = strtab["offset"] + s["name_off"]
        s["name"] = data[o:data.index(b"\0", o)].decode()
        s["data"] = data[s["offset"]:s["offset"] + s["size"]]
    return secs


def load_program(path, prog):
    """The instructions of function `prog` followed by the object's .text (its bpf-to-bpf
    callees), and, per instruction index, the symbol a relocation names: (name, value) for a
    ld_imm64 of a map or a call into .text."""
    data = open(path, "rb").read()
    secs = elf_sections(data)
    symtab = next(s for s in secs if s["type"] == 2)
    strtab = secs[symtab["link"]]["data"]
    syms = []
    for o in range(0, symtab["size"], 24):
        name, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", symtab["data"], o)
        n = strtab[name:strtab.index(b"\0", name)].decode()
        syms.append((n, info, shndx, value, size))
    fn = next(s for s in syms if s[0] == prog and (s[1] & 0xF) == 2)
    text_idx = next((i for i, s in enumerate(secs) if s["name"] == ".text"), None)
    parts = [(fn[2], fn[3], fn[4])]
    if text_idx is not None and secs[text_idx]["size"]:
        parts.append((text_idx, 0, secs[text_idx]["size"]))
    insns, relocs, base = [], {}, 0
    for sec_idx, start, size in parts:
        code = secs[sec_idx]["data"][start:start + size]
        for s in secs:
            if s["type"] == 9 and s["info"] == sec_idx:
                for o in range(0, s["size"], 16):
                    off, info = struct.unpack_from("<QQ", s["data"], o)
                    if start <= off < start + size:
                        sym = syms[info >> 32]
                        relocs[base + (off - start) // 8] = (sym[0], sym[3], sym[2] == text_idx)
        insns += [struct.unpack_from("<BBhi", code, i) for i in range(0, len(code), 8)]
        base = len(insns)
    text_base = len(insns) - (secs[text_idx]["size"] // 8 if len(parts) > 1 else 0)
    return insns, relocs, text_base


class Mem:
    def __init__(self):
        self.regions = []  # (base, bytearray)

    def add(self, base, buf):
        self.regions.append((base, buf))
        return base

    def find(self, addr, n):
        for base, buf in self.regions:
            if base <= addr and addr + n <= base + len(buf):
                return buf, addr - base
        raise RuntimeError(f"bad access {addr:#x}+{n}")

    def read(self, addr, n):
        buf, o = self.find(addr, n)
        return int.from_bytes(buf[o:o + n], "little")

    def write(self, addr, n, v):
        buf, o = self.find(addr, n)
        buf[o:o + n] = (v & ((1 << (8 * n)) - 1)).to_bytes(n, "little")

    def bytes(self, addr, n):
        buf, o = self.find(addr, n)
        return bytes(buf[o:o + n])


def a4(s):
    return ipaddress.IPv4Address(s).packed


def be16(v):
    return struct.pack(">H", v)


def maps_state():
    """Map name -> {key bytes: value bytearray}, filled as steer_ab.c fills them."""
    pid = struct.pack("<I", 4242)
    slot = struct.pack("<I", 0x40000000 | 3)
    m = {n: {} for n in MAPS}
    m["nw_config"][struct.pack("<I", 0)] = bytearray(bytes([2, 0, 0, 0, 0, 1, 1, 0]) +
                                                     struct.pack("<I", 1500))
    m["nw_claims"][a4("198.18.0.1") + be16(5000) + b"\0\0"] = bytearray(pid)
    m["nw_claims"][a4("198.18.0.1") + be16(5002) + b"\0\0"] = bytearray(slot)
    m["nw_claims"][a4("239.1.1.1") + be16(5000) + b"\0\0"] = bytearray(pid)
    m["nw_tcp_listen"][a4("198.18.0.1") + be16(80) + b"\0\0"] = bytearray(pid)
    # A listener group (issue 24): group 1, slot 3 accepting.
    m["nw_tcp_listen"][a4("198.18.0.1") + be16(8080) + b"\0\0"] = \
        bytearray(struct.pack("<I", 0x40000000 | 0x20000000 | 1))
    for g in range(1024):
        m["nw_tcp_groups"][struct.pack("<I", g)] = bytearray(80)
    m["nw_tcp_groups"][struct.pack("<I", 1)] = bytearray(struct.pack("<QII", 1 << 3, 1, 0) +
                                                         bytes([3] * 64))
    m["nw_tcp_flows"][a4("198.18.0.2") + a4("198.18.0.1") + be16(40000) + be16(5001)] = \
        bytearray(pid)
    m["nw_tcp_flows"][a4("198.18.0.2") + a4("198.18.0.1") + be16(40001) + be16(80)] = \
        bytearray(struct.pack("<I", 0x80000000))
    for i in range(4):
        m["nw_stats"][struct.pack("<I", i)] = bytearray(8)
    m["nw_xsks"][struct.pack("<I", 0)] = bytearray(4)
    m["nw_xsks"][struct.pack("<I", 3 * 64)] = bytearray(4)
    return m


def run(prog, pkt, maps):
    insns, relocs, text_base = prog
    mem = Mem()
    PKT, STK, CTX, VAL = 0x1000_0000, 0x2000_0000, 0x3000_0000, 0x4000_0000
    mem.add(PKT, bytearray(pkt))
    mem.add(STK, bytearray(512 * 8))
    ctx = bytearray(struct.pack("<IIIII", PKT, PKT + len(pkt), PKT, 1, 0))
    mem.add(CTX, ctx)
    map_ptr = {}  # fake map address -> name
    values = {}  # value region base -> (map name, key)
    next_val = [VAL]

    def value_ptr(name, key):
        for base, (n, k) in values.items():
            if n == name and k == key:
                return base
        base = next_val[0]
        next_val[0] += 0x1000
        mem.add(base, maps[name][key])
        values[base] = (name, key)
        return base

    r = [0] * 11
    r[1] = CTX
    r[10] = STK + 512 * 8
    pc, count, calls, frames = 0, 0, [], []
    while True:
        op, regs, off, imm = insns[pc]
        dst, src = regs & 0xF, regs >> 4
        cls = op & 7
        count += 1
        if op == 0x18:  # ld_imm64
            name = relocs.get(pc, (None,))[0]
            if name is not None:
                addr = 0x5000_0000 + 0x100 * (list(MAPS).index(name))
                map_ptr[addr] = name
                r[dst] = addr
            else:
                r[dst] = (imm & 0xFFFFFFFF) | ((insns[pc + 1][3] & 0xFFFFFFFF) << 32)
            pc += 2
            continue
        if cls in (4, 7):  # ALU, ALU64
            code = op & 0xF0
            b = r[src] if op & 8 else imm & M64
            a = r[dst]
            w = 64 if cls == 7 else 32
            mask = (1 << w) - 1
            a &= mask
            b &= mask
            if code == 0xD0:  # byte swap
                n = imm // 8
                v = r[dst] & ((1 << imm) - 1)
                if op & 8:  # to big endian
                    v = int.from_bytes(v.to_bytes(n, "little"), "big")
                r[dst] = v
                pc += 1
                continue
            res = {
                0x00: lambda: a + b, 0x10: lambda: a - b, 0x20: lambda: a * b,
                0x30: lambda: a // b if b else 0, 0x40: lambda: a | b, 0x50: lambda: a & b,
                0x60: lambda: a << (b & (w - 1)), 0x70: lambda: a >> (b & (w - 1)),
                0x80: lambda: -a, 0x90: lambda: a % b if b else a, 0xA0: lambda: a ^ b,
                0xB0: lambda: b,
                0xC0: lambda: (a - (1 << w) if a >> (w - 1) else a) >> (b & (w - 1)),
            }[code]()
            r[dst] = res & mask
            pc += 1
            continue
        if cls == 1:  # LDX
            n = {0x00: 4, 0x08: 2, 0x10: 1, 0x18: 8}[op & 0x18]
            r[dst] = mem.read((r[src] + off) & M64, n)
            pc += 1
            continue
        if cls in (2, 3):  # ST, STX
            n = {0x00: 4, 0x08: 2, 0x10: 1, 0x18: 8}[op & 0x18]
            v = imm if cls == 2 else r[src]
            mem.write((r[dst] + off) & M64, n, v)
            pc += 1
            continue
        if cls in (5, 6):
            code = op & 0xF0
            if code == 0x90:
                if not frames:
                    return r[0], count, calls
                pc, r[6:11] = frames.pop()
                continue
            if code == 0x80 and src == 1:  # bpf-to-bpf call
                calls.append("call")
                frames.append((pc + 1, r[6:11]))
                r[10] -= 512
                rel = relocs.get(pc)
                pc = (text_base + rel[1] // 8 + imm + 1) if rel and rel[2] else pc + imm + 1
                continue
            if code == 0x80:
                name = HELPERS.get(imm, str(imm))
                m = map_ptr.get(r[1])
                calls.append(name + (f"({m})" if m else ""))
                if imm == 1:
                    ks, _ = MAPS[m]
                    key = mem.bytes(r[2], ks)
                    r[0] = value_ptr(m, key) if key in maps[m] else 0
                elif imm == 2:
                    ks, vs = MAPS[m]
                    key = mem.bytes(r[2], ks)
                    maps[m][key] = bytearray(mem.bytes(r[3], vs))
                    r[0] = 0
                elif imm == 3:
                    ks, _ = MAPS[m]
                    maps[m].pop(mem.bytes(r[2], ks), None)
                    r[0] = 0
                elif imm == 51:
                    key = struct.pack("<I", r[2] & 0xFFFFFFFF)
                    r[0] = 4 if key in maps[m] else r[3] & 0xFF
                elif imm == 163:
                    r[0] = 0 if mem.read(r[3], 4) <= 1500 else 1
                else:
                    raise RuntimeError(f"helper {imm}")
                for i in range(1, 6):
                    r[i] = 0xDEAD
                pc += 1
                continue
            w = 64 if cls == 5 else 32
            mask = (1 << w) - 1
            a = r[dst] & mask
            b = (r[src] if op & 8 else imm & M64) & mask

            def s(x):
                return x - (1 << w) if x >> (w - 1) else x
            take = {
                0x00: lambda: True, 0x10: lambda: a == b, 0x20: lambda: a > b,
                0x30: lambda: a >= b, 0x40: lambda: bool(a & b), 0x50: lambda: a != b,
                0x60: lambda: s(a) > s(b), 0x70: lambda: s(a) >= s(b), 0xA0: lambda: a < b,
                0xB0: lambda: a <= b, 0xC0: lambda: s(a) < s(b), 0xD0: lambda: s(a) <= s(b),
            }[code]()
            pc += 1 + (off if take else 0)
            continue
        raise RuntimeError(f"opcode {op:#x} at {pc}")


def ip4(dmac, proto, src, dst, sport, dport, ihl=5, frag=0, payload=64, flags=0x10):
    l4 = 20 if proto == 6 else 8
    ip = bytearray(ihl * 4)
    ip[0] = 0x40 | ihl
    ip[2:4] = be16(ihl * 4 + l4 + payload)
    ip[4:6] = be16(0x1234)
    ip[6:8] = be16(frag)
    ip[8] = 64
    ip[9] = proto
    ip[12:16] = a4(src)
    ip[16:20] = a4(dst)
    l = bytearray(l4)
    l[0:2] = be16(sport)
    l[2:4] = be16(dport)
    if proto == 6:
        l[12], l[13] = 5 << 4, flags
    return bytes(dmac) + bytes([2, 0, 0, 0, 0, 2]) + b"\x08\x00" + bytes(ip) + bytes(l) + \
        bytes(payload)


OUR = [2, 0, 0, 0, 0, 1]
PACKETS = [
    ("udp_claimed", ip4(OUR, 17, "198.18.0.2", "198.18.0.1", 40000, 5000)),
    ("udp_claimed_slot", ip4(OUR, 17, "198.18.0.2", "198.18.0.1", 40000, 5002)),
    ("tcp_flow", ip4(OUR, 6, "198.18.0.2", "198.18.0.1", 40000, 5001, payload=32)),
    ("tcp_listener", ip4(OUR, 6, "198.18.0.2", "198.18.0.1", 40002, 80, payload=32)),
    ("tcp_group_syn", ip4(OUR, 6, "198.18.0.2", "198.18.0.1", 40010, 8080, payload=0, flags=2)),
    ("tcp_group_ack", ip4(OUR, 6, "198.18.0.2", "198.18.0.1", 40010, 8080, payload=32)),
    ("tcp_passed_flow", ip4(OUR, 6, "198.18.0.2", "198.18.0.1", 40001, 80, payload=32)),
    ("udp_unclaimed", ip4(OUR, 17, "198.18.0.2", "198.18.0.1", 40000, 6000)),
    ("tcp_unclaimed", ip4(OUR, 6, "198.18.0.2", "198.18.0.1", 40000, 22, payload=32)),
    ("udp_mcast", ip4([1, 0, 0x5E, 1, 1, 1], 17, "198.18.0.2", "239.1.1.1", 40000, 5000)),
    ("udp_bcast_unclaimed", ip4([255] * 6, 17, "198.18.0.2", "198.18.0.255", 40000, 67)),
    ("udp_other_host", ip4([2, 0, 0, 0, 0, 9], 17, "198.18.0.2", "198.18.0.1", 40000, 5000)),
    ("udp_ip_options", ip4(OUR, 17, "198.18.0.2", "198.18.0.1", 40000, 5000, ihl=6)),
    ("udp_gso_superframe", ip4(OUR, 17, "198.18.0.2", "198.18.0.1", 40000, 5000, payload=3000)),
    ("udp_fragment", ip4(OUR, 17, "198.18.0.2", "198.18.0.1", 40000, 5000, frag=0x2000)),
    ("tcp_frag_first", ip4(OUR, 6, "198.18.0.2", "198.18.0.1", 40000, 5001, frag=0x2000,
                           payload=32)),
    ("tcp_frag_middle", ip4(OUR, 6, "198.18.0.2", "198.18.0.1", 40000, 5001, frag=0x2001,
                            payload=32)),
    ("tcp_frag_last", ip4(OUR, 6, "198.18.0.2", "198.18.0.1", 40000, 5001, frag=0x0002,
                          payload=32)),
    ("arp", bytes([255] * 6) + bytes([2, 0, 0, 0, 0, 2]) + b"\x08\x06" + bytes(28)),
    ("ipv6", bytes(OUR) + bytes([2, 0, 0, 0, 0, 2]) + b"\x86\xdd\x60" + bytes(47)),
    ("runt_udp", ip4(OUR, 17, "198.18.0.2", "198.18.0.1", 40000, 5000)[:36]),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("objects", nargs="*")
    ap.add_argument("--prog", default="nw_steer")
    ap.add_argument("--emit", action="store_true",
                    help="print the packets (name, frame in hex) for steer_ab.c and stop")
    a = ap.parse_args()
    if a.emit:
        for name, pkt in PACKETS:
            print(name, pkt.hex())
        return 0
    progs = [load_program(o, a.prog) for o in a.objects]
    print("%-20s" % "packet" + "".join(" | %-8s %5s %-30s" % ("verdict", "insns", "calls")
                                       for _ in progs))
    # One map state per program, kept from packet to packet (a TCP fragment's first fragment
    # leaves the entry its later fragments find), as in the kernel.
    states = [maps_state() for _ in progs]
    for name, pkt in PACKETS:
        cols = []
        for prog, maps in zip(progs, states):
            ret, n, calls = run(prog, pkt, maps)
            short = ",".join(c.replace("map_lookup_elem", "lookup").replace("redirect_map", "redir")
                             .replace("(nw_", "(") for c in calls)
            cols.append(" | %-8s %5d %-30s" % (ACTIONS[ret] if ret < 5 else ret, n, short))
        print("%-20s" % name + "".join(cols))
    print("static (with .text): " +
          ", ".join(f"{o}: {len(p[0])} insns" for o, p in zip(a.objects, progs)))


if __name__ == "__main__":
    sys.exit(main())
