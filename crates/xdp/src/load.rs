//! Loading the steering object without aya's `EbpfLoader`.
//!
//! aya 0.14's `EbpfLoader::new()` parses the kernel's BTF
//! (`/sys/kernel/btf/vmlinux`, 5.5 MB read 4 KiB at a time, ~63 M
//! instructions) before `.btf(None)` can say it is not wanted, and the
//! first `load` probes ~20 kernel features with throw-away programs and
//! maps. steer.c needs neither: it has no CO-RE relocation and no global
//! data, its maps are plain hash/array/XSK maps and its program is one XDP
//! function. Every process under `nanowire run` paid both at its first
//! accelerated socket (docs/benchmarks.md, "Session 9: churn").
//!
//! So the object is parsed with aya-obj (what `EbpfLoader` uses
//! underneath), its maps are created and its program loaded with
//! `bpf(2)` directly, and the link is created with `BPF_LINK_CREATE`. The
//! maps are then handed to aya's typed wrappers (`MapData::from_fd`), which
//! the rest of the crate keeps using.

use aya::maps::{Map, MapData};
use aya_obj::generated::{bpf_attach_type, bpf_cmd, bpf_insn, bpf_map_type, bpf_prog_type};
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The parsed object: its maps (created), and its programs' instructions
/// (relocated against those maps).
pub struct Loaded {
    /// Each map with its type (BPF_MAP_TYPE_*).
    maps: HashMap<String, (u32, MapData)>,
    programs: HashMap<String, Vec<bpf_insn>>,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct LinkUpdateAttr {
    link_fd: u32,
    new_prog_fd: u32,
    flags: u32,
    old_prog_fd: u32,
}

#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// What the kernel says of a BPF program (a prefix of `struct bpf_prog_info`).
#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct ProgInfo {
    pub prog_type: u32,
    pub id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    pub nr_map_ids: u32,
    map_ids: u64,
    pub name: [u8; 16],
}

/// What the kernel says of a BPF map (a prefix of `struct bpf_map_info`).
#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct MapInfo {
    pub map_type: u32,
    pub id: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub name: [u8; 16],
}

/// What the kernel says of an XDP link (`struct bpf_link_info` up to its
/// `xdp.ifindex`).
#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct LinkInfo {
    pub link_type: u32,
    pub id: u32,
    pub prog_id: u32,
    pad: u32,
    pub ifindex: u32,
    pad2: u32,
}

/// `BPF_LINK_TYPE_XDP`.
pub const LINK_TYPE_XDP: u32 = 6;

/// BPF_OBJ_GET_INFO_BY_FD into `info` (a prefix of the kernel's struct).
fn obj_info<T>(fd: RawFd, info: &mut T) -> std::io::Result<()> {
    let mut attr = InfoAttr {
        bpf_fd: fd as u32,
        info_len: std::mem::size_of::<T>() as u32,
        info: (info as *mut T) as u64,
    };
    bpf_call(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr).map(|_| ())
}

/// The kernel's description of program `fd`, with the ids of the maps it
/// uses (up to 32).
pub fn prog_info(fd: RawFd) -> std::io::Result<(ProgInfo, Vec<u32>)> {
    let mut ids = [0u32; 32];
    let mut info = ProgInfo {
        nr_map_ids: ids.len() as u32,
        map_ids: ids.as_mut_ptr() as u64,
        ..Default::default()
    };
    obj_info(fd, &mut info)?;
    let n = (info.nr_map_ids as usize).min(ids.len());
    Ok((info, ids[..n].to_vec()))
}

/// The kernel's description of map `fd`.
pub fn map_info(fd: RawFd) -> std::io::Result<MapInfo> {
    let mut info = MapInfo::default();
    obj_info(fd, &mut info)?;
    Ok(info)
}

/// The kernel's description of link `fd`.
pub fn link_info(fd: RawFd) -> std::io::Result<LinkInfo> {
    let mut info = LinkInfo::default();
    obj_info(fd, &mut info)?;
    Ok(info)
}

/// The kernel's `union bpf_attr` for BPF_MAP_*_BATCH.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Entries asked for per BPF_MAP_LOOKUP_BATCH call (a hash bucket holding
/// more would answer ENOSPC: far beyond any bucket's length here).
const BATCH: usize = 4096;

/// Every entry of hash map `fd` (keys of `key_size`, values of
/// `value_size` bytes): concatenated keys and values, in the same order.
/// BPF_MAP_LOOKUP_BATCH, one call per [`BATCH`] entries, instead of two
/// calls per entry (get-next-key, lookup) as a map iterator makes.
pub fn map_lookup_all(
    fd: RawFd,
    key_size: usize,
    value_size: usize,
) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    // The position (a hash bucket index for hash maps: at most a key's size).
    let mut pos = [[0u64; 2]; 2];
    let mut first = true;
    let (mut kb, mut vb) = (vec![0u8; BATCH * key_size], vec![0u8; BATCH * value_size]);
    loop {
        let (in_b, out_b) = pos.split_at_mut(1);
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                in_b[0].as_mut_ptr() as u64
            },
            out_batch: out_b[0].as_mut_ptr() as u64,
            keys: kb.as_mut_ptr() as u64,
            values: vb.as_mut_ptr() as u64,
            count: BATCH as u32,
            map_fd: fd as u32,
            ..Default::default()
        };
        let r = bpf_call(bpf_cmd::BPF_MAP_LOOKUP_BATCH, &mut attr);
        // The kernel sets `count` to the entries copied, also on the last
        // call (ENOENT: no more).
        let n = (attr.count as usize).min(BATCH);
        keys.extend_from_slice(&kb[..n * key_size]);
        values.extend_from_slice(&vb[..n * value_size]);
        match r {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok((keys, values)),
            Err(e) => return Err(e),
        }
        pos[0] = pos[1];
        first = false;
    }
}

/// Delete `keys` (concatenated, `key_size` bytes each) from map `fd`:
/// BPF_MAP_DELETE_BATCH, skipping a key already gone (the kernel stops at
/// it). Returns how many were deleted.
pub fn map_delete_keys(fd: RawFd, keys: &[u8], key_size: usize) -> std::io::Result<usize> {
    let total = keys.len() / key_size;
    let (mut at, mut deleted) = (0usize, 0usize);
    while at < total {
        let mut attr = BatchAttr {
            keys: keys[at * key_size..].as_ptr() as u64,
            count: (total - at) as u32,
            map_fd: fd as u32,
            ..Default::default()
        };
        let r = bpf_call(bpf_cmd::BPF_MAP_DELETE_BATCH, &mut attr);
        let n = (attr.count as usize).min(total - at);
        deleted += n;
        match r {
            Ok(_) => return Ok(deleted),
            // Key `at + n` was not there: on with the next.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => at += n + 1,
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

/// A kernel object name (NUL-padded) as text.
pub fn name_of(n: &[u8; 16]) -> String {
    let end = n.iter().position(|&b| b == 0).unwrap_or(n.len());
    String::from_utf8_lossy(&n[..end]).into_owned()
}

/// BPF_PROG_LOAD attempts after one the verifier abandoned for a signal.
const PROG_LOAD_EAGAIN_RETRIES: usize = 16;

/// `bpf(cmd, attr)`: a new fd, or the errno as an io::Error.
fn bpf_fd<T>(cmd: bpf_cmd, attr: &mut T) -> std::io::Result<OwnedFd> {
    let r = bpf_call(cmd, attr)?;
    // SAFETY: a successful BPF_*_CREATE/LOAD returns a new fd we own.
    // Kept for the engine's life: above the program's numbers.
    Ok(crate::sys::above_floor(unsafe {
        OwnedFd::from_raw_fd(r as RawFd)
    }))
}

/// `bpf(cmd, attr)`: the kernel's non-negative result, or the errno as an
/// io::Error. Raw (crate::sys): the engine's own call never enters the
/// shim, also from the neighbour thread (a program upgrade, below).
fn bpf_call<T>(cmd: bpf_cmd, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a repr(C) prefix of the kernel's union bpf_attr for
    // `cmd`, valid for reads and writes of size_of::<T>() bytes; the kernel
    // zero-extends a shorter attr. Pointers inside it (instructions,
    // license, log buffer) are owned by the caller for the whole call.
    let r = unsafe {
        crate::sys::bpf(
            cmd as libc::c_int,
            (attr as *mut T).cast::<libc::c_void>(),
            std::mem::size_of::<T>(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r)
}

/// An object name as the kernel keeps it (15 bytes and a NUL).
fn obj_name(name: &str) -> [u8; 16] {
    let mut n = [0u8; 16];
    for (d, s) in n.iter_mut().zip(name.bytes().take(15)) {
        *d = if s.is_ascii_alphanumeric() || s == b'_' || s == b'.' {
            s
        } else {
            b'_'
        };
    }
    n
}

/// Take map `name` out of `made` if the kernel says it is what `want`
/// would have created.
fn adopt_map(
    made: &mut Vec<(String, RawFd)>,
    name: &str,
    want: &MapCreateAttr,
) -> Result<OwnedFd, String> {
    // One the attached program does not use (closed by the launcher: a
    // frags-aware program needs no later load) is made anew.
    let Some(i) = made.iter().position(|(n, _)| n == name) else {
        let mut attr = MapCreateAttr {
            map_name: want.map_name,
            ..*want
        };
        return bpf_fd(bpf_cmd::BPF_MAP_CREATE, &mut attr)
            .map_err(|e| format!("cannot create map {name}: {e}"));
    };
    let fd = made[i].1;
    let got = map_info(fd).map_err(|e| format!("map {name} (fd {fd}): {e}"))?;
    let seen = (
        got.map_type,
        got.key_size,
        got.value_size,
        got.max_entries,
        got.map_flags,
        got.name,
    );
    let wanted = (
        want.map_type,
        want.key_size,
        want.value_size,
        want.max_entries,
        want.map_flags,
        want.map_name,
    );
    if seen != wanted {
        return Err(format!(
            "fd {fd} is not the map {name} this program makes (type, key, value, entries, \
             flags, name: {seen:?}, want {wanted:?})"
        ));
    }
    made.swap_remove(i);
    // SAFETY: `made` owned the fd (the caller's contract); it is removed
    // from there, so this is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Loaded {
    /// Parse `data`, create its maps, relocate its programs. The maps
    /// named in `sizes` are made with the given number of entries instead
    /// of the object's (maps a user of the program never fills: their
    /// allocation is part of every engine's start).
    pub fn new(data: &[u8], sizes: &[(&str, u32)]) -> Result<Loaded, String> {
        Self::build(data, sizes, None)
    }

    fn build(
        data: &[u8],
        sizes: &[(&str, u32)],
        mut made: Option<&mut Vec<(String, RawFd)>>,
    ) -> Result<Loaded, String> {
        let mut obj = aya_obj::Object::parse(data)
            .map_err(|e| format!("cannot parse the XDP object: {e}"))?;
        let mut fds: Vec<(String, OwnedFd, aya_obj::Map)> = Vec::new();
        for (name, m) in obj.maps.drain() {
            let section = m.section_kind();
            if !matches!(
                section,
                aya_obj::EbpfSectionKind::Maps | aya_obj::EbpfSectionKind::BtfMaps
            ) {
                // Global data would need its initial contents written and
                // the map frozen; steer.c has none.
                return Err(format!(
                    "the XDP object has global data ({name}), which this loader does not handle"
                ));
            }
            let mut attr = MapCreateAttr {
                map_type: m.map_type(),
                key_size: m.key_size(),
                value_size: m.value_size(),
                max_entries: sizes
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map_or(m.max_entries(), |&(_, n)| n),
                map_flags: m.map_flags(),
                map_name: obj_name(&name),
                ..Default::default()
            };
            let fd = match made.as_deref_mut() {
                None => bpf_fd(bpf_cmd::BPF_MAP_CREATE, &mut attr)
                    .map_err(|e| format!("cannot create map {name}: {e}"))?,
                Some(made) => adopt_map(made, &name, &attr)?,
            };
            fds.push((name, fd, m));
        }
        let text_sections = obj.functions.keys().map(|(s, _)| *s).collect();
        obj.relocate_maps(
            fds.iter().map(|(n, fd, m)| (n.as_str(), fd.as_raw_fd(), m)),
            &text_sections,
        )
        .map_err(|e| format!("cannot relocate the XDP object's maps: {e}"))?;
        obj.relocate_calls(&text_sections)
            .map_err(|e| format!("cannot relocate the XDP object's calls: {e}"))?;
        let programs = obj
            .programs
            .iter()
            .filter_map(|(name, p)| {
                let f = obj.functions.get(&p.function_key())?;
                Some((name.clone(), f.instructions.clone()))
            })
            .collect();
        let mut maps = HashMap::new();
        for (name, fd, m) in fds {
            let d = MapData::from_fd(fd).map_err(|e| format!("map {name}: {e}"))?;
            maps.insert(name, (m.map_type(), d));
        }
        Ok(Loaded { maps, programs })
    }

    /// As [`Loaded::new`], with maps made earlier (`maps`: name and fd,
    /// by `nanowire run` before it exec'd this program, see prestart.rs)
    /// instead of new ones: each must be the object's map of that name as
    /// [`Loaded::new`] would have made it (type, key and value size,
    /// entries, flags, name), else the error says which is not. The fds
    /// taken are removed from `maps` (owned by the result from then on).
    pub fn adopt(
        data: &[u8],
        sizes: &[(&str, u32)],
        maps: &mut Vec<(String, RawFd)>,
    ) -> Result<Loaded, String> {
        Self::build(data, sizes, Some(maps))
    }

    /// The maps not taken out, by name, and their fds (open as long as
    /// `self`: the programs' instructions name them by number).
    pub fn map_fds_named(&self) -> Vec<(String, RawFd)> {
        self.maps
            .iter()
            .map(|(n, (_, m))| (n.clone(), m.fd().as_fd().as_raw_fd()))
            .collect()
    }

    /// Take map `name` out as aya's `Map` of its kernel type, with its fd
    /// (open as long as the map).
    pub fn take_map(&mut self, name: &str) -> Result<(Map, RawFd), String> {
        let (t, m) = self
            .maps
            .remove(name)
            .ok_or_else(|| format!("the XDP object has no map {name}"))?;
        let fd = m.fd().as_fd().as_raw_fd();
        let map = match t {
            x if x == bpf_map_type::BPF_MAP_TYPE_HASH as u32 => Map::HashMap(m),
            x if x == bpf_map_type::BPF_MAP_TYPE_LRU_HASH as u32 => Map::LruHashMap(m),
            x if x == bpf_map_type::BPF_MAP_TYPE_ARRAY as u32 => Map::Array(m),
            x if x == bpf_map_type::BPF_MAP_TYPE_PERCPU_ARRAY as u32 => Map::PerCpuArray(m),
            x if x == bpf_map_type::BPF_MAP_TYPE_XSKMAP as u32 => Map::XskMap(m),
            other => return Err(format!("map {name}: unexpected map type {other}")),
        };
        Ok((map, fd))
    }

    /// Load XDP program `name` (`frags`: multi-buffer aware,
    /// BPF_F_XDP_HAS_FRAGS). On refusal the verifier's log is asked for
    /// and its last lines given.
    pub fn load_xdp(&self, name: &str, frags: bool) -> Result<OwnedFd, String> {
        let insns = self
            .programs
            .get(name)
            .ok_or_else(|| format!("the XDP object has no program {name}"))?;
        load_xdp_insns(name, insns, frags)
    }
}

/// `r0 = XDP_DROP; exit`: an XDP program that drops every frame.
pub fn drop_insns() -> [bpf_insn; 2] {
    // BPF_ALU64 | BPF_MOV | BPF_K (0xb7), dst r0, imm XDP_DROP (1);
    // BPF_JMP | BPF_EXIT (0x95).
    let mov = bpf_insn {
        code: 0xb7,
        _bitfield_align_1: [],
        _bitfield_1: bpf_insn::new_bitfield_1(0, 0),
        off: 0,
        imm: 1,
    };
    let exit = bpf_insn {
        code: 0x95,
        imm: 0,
        ..mov
    };
    [mov, exit]
}

/// Load an XDP program from its instructions (relocated). On refusal the
/// verifier's log is asked for and its last lines given.
pub fn load_xdp_insns(name: &str, insns: &[bpf_insn], frags: bool) -> Result<OwnedFd, String> {
    let license = c"GPL";
    let mut attr = ProgLoadAttr {
        prog_type: bpf_prog_type::BPF_PROG_TYPE_XDP as u32,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_flags: if frags {
            aya_obj::generated::BPF_F_XDP_HAS_FRAGS
        } else {
            0
        },
        prog_name: obj_name(name),
        expected_attach_type: bpf_attach_type::BPF_XDP as u32,
        ..Default::default()
    };
    // The verifier gives up with EAGAIN when a signal arrives while it
    // works (an application's timer signal, a tracer): the same load
    // again, as libbpf does (bounded: each attempt is interrupted only
    // by a signal sent during it).
    let mut first = bpf_fd(bpf_cmd::BPF_PROG_LOAD, &mut attr);
    for _ in 0..PROG_LOAD_EAGAIN_RETRIES {
        match &first {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                first = bpf_fd(bpf_cmd::BPF_PROG_LOAD, &mut attr);
            }
            _ => break,
        }
    }
    match first {
        Ok(fd) => Ok(fd),
        Err(e) => {
            let mut log = vec![0u8; 1 << 16];
            attr.log_level = 1;
            attr.log_size = log.len() as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
            let again = bpf_fd(bpf_cmd::BPF_PROG_LOAD, &mut attr);
            let text = String::from_utf8_lossy(&log);
            let text = text.trim_end_matches('\0').trim();
            let tail: Vec<&str> = text.lines().rev().take(4).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            match again {
                // Loaded with the log on (should not happen): take it.
                Ok(fd) => Ok(fd),
                Err(_) => Err(format!("{e}: {}", tail.join(" / "))),
            }
        }
    }
}

/// Attach XDP program `prog` to `ifindex` through a BPF link (owned by this
/// process: closing it, or the process dying, detaches the program).
/// `flags`: XDP_FLAGS_SKB_MODE or XDP_FLAGS_DRV_MODE.
pub fn link_xdp(prog: &OwnedFd, ifindex: u32, flags: u32) -> std::io::Result<OwnedFd> {
    let mut attr = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type: bpf_attach_type::BPF_XDP as u32,
        flags,
    };
    bpf_fd(bpf_cmd::BPF_LINK_CREATE, &mut attr)
}

/// Replace the program behind XDP link `link` by `prog`, atomically
/// (BPF_LINK_UPDATE): every frame from then on runs `prog`; the link, its
/// attach mode and the maps stay.
pub fn link_update(link: &OwnedFd, prog: &OwnedFd) -> std::io::Result<()> {
    let mut attr = LinkUpdateAttr {
        link_fd: link.as_raw_fd() as u32,
        new_prog_fd: prog.as_raw_fd() as u32,
        ..Default::default()
    };
    bpf_call(bpf_cmd::BPF_LINK_UPDATE, &mut attr).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drop_program_is_mov_r0_xdp_drop_then_exit() {
        let [mov, exit] = drop_insns();
        let f = |i: bpf_insn| (i.code, i.dst_reg(), i.src_reg(), i.off, i.imm);
        assert_eq!(f(mov), (0xb7, 0, 0, 0, 1), "r0 = 1 (XDP_DROP)");
        assert_eq!(f(exit), (0x95, 0, 0, 0, 0), "exit");
    }

    #[test]
    fn attr_layouts_match_the_kernels_bpf_attr() {
        // Offsets of union bpf_attr's members (include/uapi/linux/bpf.h).
        assert_eq!(std::mem::offset_of!(MapCreateAttr, map_flags), 16);
        assert_eq!(std::mem::offset_of!(MapCreateAttr, map_name), 28);
        assert_eq!(std::mem::offset_of!(ProgLoadAttr, insns), 8);
        assert_eq!(std::mem::offset_of!(ProgLoadAttr, log_buf), 32);
        assert_eq!(std::mem::offset_of!(ProgLoadAttr, prog_flags), 44);
        assert_eq!(std::mem::offset_of!(ProgLoadAttr, prog_name), 48);
        assert_eq!(std::mem::offset_of!(ProgLoadAttr, expected_attach_type), 68);
        assert_eq!(std::mem::offset_of!(LinkCreateAttr, attach_type), 8);
        assert_eq!(std::mem::offset_of!(LinkCreateAttr, flags), 12);
        assert_eq!(std::mem::offset_of!(LinkUpdateAttr, new_prog_fd), 4);
        assert_eq!(std::mem::offset_of!(LinkUpdateAttr, old_prog_fd), 12);
        // The `batch` member (BPF_MAP_LOOKUP_BATCH, BPF_MAP_DELETE_BATCH).
        assert_eq!(std::mem::offset_of!(BatchAttr, keys), 16);
        assert_eq!(std::mem::offset_of!(BatchAttr, count), 32);
        assert_eq!(std::mem::offset_of!(BatchAttr, map_fd), 36);
        assert_eq!(std::mem::offset_of!(BatchAttr, flags), 48);
    }

    /// A real hash map of the pins' shape (12-byte keys, 4-byte values):
    /// the batch lookup returns every entry once, with its value, across
    /// several batches; the batch delete skips keys that are not there
    /// and deletes all the others.
    #[test]
    #[ignore = "needs root"]
    fn batch_lookup_returns_every_entry_and_batch_delete_skips_missing_keys() {
        let mut attr = MapCreateAttr {
            map_type: aya_obj::generated::bpf_map_type::BPF_MAP_TYPE_HASH as u32,
            key_size: 12,
            value_size: 4,
            max_entries: 65536,
            map_name: obj_name("nw_test_batch"),
            ..Default::default()
        };
        let map = bpf_fd(bpf_cmd::BPF_MAP_CREATE, &mut attr).expect("BPF_MAP_CREATE (root?)");
        let fd = map.as_raw_fd();
        #[repr(C)]
        struct ElemAttr {
            map_fd: u32,
            pad: u32,
            key: u64,
            value: u64,
            flags: u64,
        }
        let key = |i: u32| -> [u8; 12] {
            let mut k = [0u8; 12];
            k[..4].copy_from_slice(&i.to_ne_bytes());
            k[8..].copy_from_slice(&(!i).to_ne_bytes());
            k
        };
        const N: u32 = 10_000; // more than two batches
        for i in 0..N {
            let (k, v) = (key(i), (i * 7).to_ne_bytes());
            let mut a = ElemAttr {
                map_fd: fd as u32,
                pad: 0,
                key: k.as_ptr() as u64,
                value: v.as_ptr() as u64,
                flags: 0,
            };
            bpf_call(bpf_cmd::BPF_MAP_UPDATE_ELEM, &mut a).expect("update");
        }
        let (keys, values) = map_lookup_all(fd, 12, 4).expect("lookup batch");
        assert_eq!(keys.len(), N as usize * 12);
        let mut seen = vec![false; N as usize];
        for (k, v) in keys.chunks_exact(12).zip(values.chunks_exact(4)) {
            let i = u32::from_ne_bytes(k[..4].try_into().unwrap());
            assert_eq!(k, key(i), "key {i}");
            assert_eq!(
                u32::from_ne_bytes(v.try_into().unwrap()),
                i * 7,
                "value of {i}"
            );
            assert!(
                !std::mem::replace(&mut seen[i as usize], true),
                "key {i} twice"
            );
        }
        // Every key, with a missing one after each 100th (and at both ends).
        let mut del = key(N + 1).to_vec();
        for i in 0..N {
            del.extend_from_slice(&key(i));
            if i % 100 == 0 {
                del.extend_from_slice(&key(N + 2 + i));
            }
        }
        del.extend_from_slice(&key(2 * N + 5));
        assert_eq!(
            map_delete_keys(fd, &del, 12).expect("delete batch"),
            N as usize
        );
        let (left, _) = map_lookup_all(fd, 12, 4).expect("lookup batch of an empty map");
        assert!(left.is_empty(), "{} bytes of keys left", left.len());
    }

    #[test]
    fn names_are_truncated_and_sanitised() {
        assert_eq!(&obj_name("nw_steer_frags")[..15], b"nw_steer_frags\0");
        assert_eq!(obj_name("a-very-long-map-name-indeed")[15], 0);
        assert_eq!(&obj_name("a-b")[..4], b"a_b\0");
    }

    #[test]
    fn the_steering_object_parses_with_its_maps_and_both_programs() {
        // Parsing only: creating maps needs privilege (the lab tests load it).
        let obj = aya_obj::Object::parse(crate::steer_object()).unwrap();
        for m in [
            "nw_claims",
            "nw_xsks",
            "nw_stats",
            "nw_config",
            "nw_tcp_listen",
            "nw_tcp_flows",
            "nw_tcp_frags",
        ] {
            assert!(obj.maps.contains_key(m), "{m}");
        }
        assert!(obj.programs.contains_key("nw_steer"));
        assert!(obj.programs.contains_key("nw_steer_frags"));
    }
}
