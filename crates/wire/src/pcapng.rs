//! A pcapng writer with nanosecond timestamps (`if_tsresol` = 9).
//!
//! Blocks written: one Section Header Block, one Interface Description Block
//! per interface, then Enhanced Packet Blocks. Little-endian, as readers
//! expect from the byte-order magic. Wireshark and tcpdump read the result.

use std::io::{self, Write};

const SHB: u32 = 0x0a0d_0d0a;
const IDB: u32 = 0x0000_0001;
const EPB: u32 = 0x0000_0006;
const BYTE_ORDER_MAGIC: u32 = 0x1a2b_3c4d;
const LINKTYPE_ETHERNET: u16 = 1;
const OPT_END: u16 = 0;
const OPT_COMMENT: u16 = 1;
const SHB_USERAPPL: u16 = 4;
const IF_NAME: u16 = 2;
const IF_TSRESOL: u16 = 9;

fn pad4(n: usize) -> usize {
    (4 - n % 4) % 4
}

fn option(out: &mut Vec<u8>, code: u16, value: &[u8]) {
    out.extend_from_slice(&code.to_le_bytes());
    out.extend_from_slice(&(value.len() as u16).to_le_bytes());
    out.extend_from_slice(value);
    out.extend(std::iter::repeat_n(0u8, pad4(value.len())));
}

fn block(kind: u32, body: &[u8]) -> Vec<u8> {
    let total = (12 + body.len()) as u32;
    let mut b = Vec::with_capacity(total as usize);
    b.extend_from_slice(&kind.to_le_bytes());
    b.extend_from_slice(&total.to_le_bytes());
    b.extend_from_slice(body);
    b.extend_from_slice(&total.to_le_bytes());
    b
}

/// Writes a pcapng stream. Timestamps are nanoseconds since the Unix epoch.
pub struct PcapngWriter<W: Write> {
    out: W,
    interfaces: u32,
    snaplen: u32,
}

impl<W: Write> PcapngWriter<W> {
    /// Write the section header. `snaplen` bounds the bytes kept per packet.
    pub fn new(mut out: W, application: &str, snaplen: u32) -> io::Result<Self> {
        let mut body = Vec::new();
        body.extend_from_slice(&BYTE_ORDER_MAGIC.to_le_bytes());
        body.extend_from_slice(&1u16.to_le_bytes()); // major
        body.extend_from_slice(&0u16.to_le_bytes()); // minor
        body.extend_from_slice(&(-1i64).to_le_bytes()); // section length unknown
        option(&mut body, SHB_USERAPPL, application.as_bytes());
        option(&mut body, OPT_END, &[]);
        out.write_all(&block(SHB, &body))?;
        Ok(PcapngWriter {
            out,
            interfaces: 0,
            snaplen,
        })
    }

    /// Describe an Ethernet interface; returns its id for `write_packet`.
    pub fn add_interface(&mut self, name: &str) -> io::Result<u32> {
        let mut body = Vec::new();
        body.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        body.extend_from_slice(&0u16.to_le_bytes()); // reserved
        body.extend_from_slice(&self.snaplen.to_le_bytes());
        option(&mut body, IF_NAME, name.as_bytes());
        option(&mut body, IF_TSRESOL, &[9]); // 10^-9 s
        option(&mut body, OPT_END, &[]);
        self.out.write_all(&block(IDB, &body))?;
        self.interfaces += 1;
        Ok(self.interfaces - 1)
    }

    /// Append one frame seen at `ts_ns` (ns since the epoch), `orig_len` bytes
    /// long on the wire, with an optional comment (e.g. "rx queue 0, xdp").
    pub fn write_packet(
        &mut self,
        iface: u32,
        ts_ns: u64,
        frame: &[u8],
        orig_len: usize,
        comment: Option<&str>,
    ) -> io::Result<()> {
        if iface >= self.interfaces {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("pcapng: unknown interface id {iface}"),
            ));
        }
        let cap = frame.len().min(self.snaplen as usize);
        let mut body = Vec::with_capacity(20 + cap + 8);
        body.extend_from_slice(&iface.to_le_bytes());
        body.extend_from_slice(&((ts_ns >> 32) as u32).to_le_bytes());
        body.extend_from_slice(&(ts_ns as u32).to_le_bytes());
        body.extend_from_slice(&(cap as u32).to_le_bytes());
        body.extend_from_slice(&(orig_len as u32).to_le_bytes());
        body.extend_from_slice(&frame[..cap]);
        body.extend(std::iter::repeat_n(0u8, pad4(cap)));
        if let Some(c) = comment {
            option(&mut body, OPT_COMMENT, c.as_bytes());
            option(&mut body, OPT_END, &[]);
        }
        self.out.write_all(&block(EPB, &body))
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

/// A packet read back from a pcapng stream written by [`PcapngWriter`]
/// (used by tests and `nanowire capture --read`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedPacket {
    pub iface: u32,
    pub ts_ns: u64,
    pub orig_len: u32,
    pub data: Vec<u8>,
}

/// Parse the Enhanced Packet Blocks of a little-endian pcapng stream.
/// Refuses malformed input with an error; never panics.
pub fn read_packets(buf: &[u8]) -> Result<Vec<CapturedPacket>, String> {
    let u32_at = |o: usize| -> Result<u32, String> {
        buf.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| format!("pcapng: truncated at byte {o}"))
    };
    let mut off = 0;
    let mut out = Vec::new();
    let mut first = true;
    while off < buf.len() {
        let kind = u32_at(off)?;
        let len = u32_at(off + 4)? as usize;
        if len < 12 || !len.is_multiple_of(4) || off + len > buf.len() {
            return Err(format!("pcapng: bad block length {len} at byte {off}"));
        }
        if first && (kind != SHB || u32_at(off + 8)? != BYTE_ORDER_MAGIC) {
            return Err("pcapng: not a little-endian pcapng section".into());
        }
        first = false;
        if kind == EPB {
            if len < 32 {
                return Err(format!("pcapng: short packet block at byte {off}"));
            }
            let iface = u32_at(off + 8)?;
            let ts = (u64::from(u32_at(off + 12)?) << 32) | u64::from(u32_at(off + 16)?);
            let cap = u32_at(off + 20)? as usize;
            let orig_len = u32_at(off + 24)?;
            let data = buf
                .get(off + 28..off + 28 + cap)
                .filter(|_| 28 + cap + 4 <= len)
                .ok_or_else(|| {
                    format!("pcapng: captured length {cap} overruns its block at byte {off}")
                })?;
            out.push(CapturedPacket {
                iface,
                ts_ns: ts,
                orig_len,
                data: data.to_vec(),
            });
        }
        off += len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_with_nanoseconds() {
        let mut w = PcapngWriter::new(Vec::new(), "nanowire test", 65535).unwrap();
        let i = w.add_interface("nw-b0").unwrap();
        let ts = 1_763_700_000_123_456_789u64;
        w.write_packet(i, ts, &[1, 2, 3, 4, 5], 5, Some("rx q0"))
            .unwrap();
        w.write_packet(i, ts + 1, &[9; 64], 64, None).unwrap();
        assert!(w.write_packet(7, ts, &[0], 1, None).is_err());
        let bytes = w.into_inner();
        assert_eq!(bytes.len() % 4, 0);
        let p = read_packets(&bytes).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].ts_ns, ts);
        assert_eq!(p[0].data, vec![1, 2, 3, 4, 5]);
        assert_eq!(p[1].ts_ns, ts + 1);
        assert_eq!(p[1].orig_len, 64);
    }

    #[test]
    fn snaplen_truncates_but_keeps_orig_len() {
        let mut w = PcapngWriter::new(Vec::new(), "t", 8).unwrap();
        let i = w.add_interface("x").unwrap();
        w.write_packet(i, 1, &[7; 100], 100, None).unwrap();
        let p = read_packets(&w.into_inner()).unwrap();
        assert_eq!(p[0].data.len(), 8);
        assert_eq!(p[0].orig_len, 100);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(read_packets(&[0u8; 3]).is_err());
        assert!(read_packets(&[0u8; 64]).is_err());
        let mut w = PcapngWriter::new(Vec::new(), "t", 64).unwrap();
        let i = w.add_interface("x").unwrap();
        w.write_packet(i, 1, &[7; 10], 10, None).unwrap();
        let mut b = w.into_inner();
        for cut in 0..b.len() {
            let _ = read_packets(&b[..cut]);
        }
        let n = b.len();
        b[n - 12] = 0xff; // corrupt the EPB's captured length
        let _ = read_packets(&b);
    }
}
