//! A minimal reader of the kernel's BTF (`/sys/kernel/btf/vmlinux`): struct member offsets
//! and function prototypes, which is all the fentry/kprobe hooks need.
//!
//! Format: `Documentation/bpf/btf.rst` (header, type section, string section; type ids start
//! at 1). Written here (about 250 lines) rather than pulled in: btf-rs is LGPL and aya 0.14
//! does not expose member offsets.

use routewarden_common::route_watch::{KernelOffsets, TaskOffsets};

/// Where the running kernel publishes its BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Errors reading BTF or resolving what the hooks need from it.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The BTF file cannot be read.
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not BTF this reader understands.
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
    /// A struct the hooks read is absent.
    #[error("BTF has no struct {0}")]
    NoStruct(String),
    /// A member the hooks read is absent.
    #[error("BTF struct {strukt} has no member {member}")]
    NoMember { strukt: String, member: String },
    /// A member is a bitfield or not byte aligned.
    #[error("BTF member {strukt}.{member} is not byte aligned (bit offset {bits})")]
    Unaligned { strukt: String, member: String, bits: u32 },
    /// A hooked function is absent from BTF (renamed, inlined or removed).
    #[error("BTF has no function {0}")]
    NoFunction(String),
    /// A hooked function's prototype differs from the one the hook was written against.
    #[error("prototype of {func} changed: BTF says ({found}), hook written against ({expected})")]
    Prototype { func: String, found: String, expected: String },
}

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Clone, Debug)]
struct Member {
    name: u32,
    ty: u32,
    /// Bit offset (bitfield size stripped).
    bits: u32,
}

#[derive(Clone, Debug)]
struct Type {
    kind: u32,
    name: u32,
    /// `size` or `type` (id) depending on the kind.
    sot: u32,
    /// Members (struct/union) or params (func_proto, `bits` unused).
    members: Vec<Member>,
    /// Element type of an array.
    elem: u32,
}

/// Parsed BTF: types by id and the string section.
#[derive(Debug)]
pub struct Btf {
    types: Vec<Type>,
    strings: Vec<u8>,
}

fn u32_at(b: &[u8], off: usize) -> Result<u32, BtfError> {
    b.get(off..off + 4).and_then(|s| <[u8; 4]>::try_from(s).ok()).map(u32::from_le_bytes).ok_or(BtfError::Malformed("truncated"))
}

impl Btf {
    /// Read and parse the running kernel's BTF.
    pub fn from_sys() -> Result<Btf, BtfError> {
        let bytes = std::fs::read(VMLINUX_BTF).map_err(|source| BtfError::Read { path: VMLINUX_BTF.into(), source })?;
        Btf::parse(&bytes)
    }

    /// Parse BTF bytes (little endian only, as every BPF-capable x86-64/arm64 kernel).
    pub fn parse(b: &[u8]) -> Result<Btf, BtfError> {
        if b.get(0..2) != Some(&[0x9f, 0xeb]) {
            return Err(BtfError::Malformed("bad magic (not little-endian BTF)"));
        }
        let hdr_len = u32_at(b, 4)? as usize;
        let type_off = u32_at(b, 8)? as usize;
        let type_len = u32_at(b, 12)? as usize;
        let str_off = u32_at(b, 16)? as usize;
        let str_len = u32_at(b, 20)? as usize;
        let types_b = b.get(hdr_len + type_off..hdr_len + type_off + type_len).ok_or(BtfError::Malformed("type section"))?;
        let strings = b.get(hdr_len + str_off..hdr_len + str_off + str_len).ok_or(BtfError::Malformed("string section"))?.to_vec();
        // Type id 0 is `void`.
        let mut types = vec![Type { kind: 0, name: 0, sot: 0, members: Vec::new(), elem: 0 }];
        let mut off = 0;
        while off < types_b.len() {
            let name = u32_at(types_b, off)?;
            let info = u32_at(types_b, off + 4)?;
            let sot = u32_at(types_b, off + 8)?;
            off += 12;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let kind_flag = info >> 31 == 1;
            let mut t = Type { kind, name, sot, members: Vec::new(), elem: 0 };
            match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => off += 4,
                KIND_ARRAY => {
                    t.elem = u32_at(types_b, off)?;
                    off += 12;
                }
                KIND_STRUCT | KIND_UNION => {
                    for _ in 0..vlen {
                        let m_off = u32_at(types_b, off + 8)?;
                        let bits = if kind_flag { m_off & 0x00ff_ffff } else { m_off };
                        t.members.push(Member { name: u32_at(types_b, off)?, ty: u32_at(types_b, off + 4)?, bits });
                        off += 12;
                    }
                }
                KIND_ENUM => off += 8 * vlen,
                KIND_FUNC_PROTO => {
                    for _ in 0..vlen {
                        t.members.push(Member { name: u32_at(types_b, off)?, ty: u32_at(types_b, off + 4)?, bits: 0 });
                        off += 8;
                    }
                }
                KIND_DATASEC | KIND_ENUM64 => off += 12 * vlen,
                KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => {}
                _ => return Err(BtfError::Malformed("unknown type kind")),
            }
            types.push(t);
        }
        Ok(Btf { types, strings })
    }

    /// The id of the first type of `kind` named `name` (vmlinux has one per name). A scan: a
    /// start asks for a handful of names once, and an index of every struct and function name
    /// (~60,000 owned strings in a hash map) cost more than the lookups: reading the running
    /// kernel's BTF and resolving every offset took 44-75 ms with it, 21-25 ms without.
    fn find(&self, kind: u32, name: &str) -> Option<u32> {
        let want = name.as_bytes();
        let named = |off: u32| {
            let start = off as usize;
            self.strings.get(start..start + want.len()) == Some(want) && self.strings.get(start + want.len()) == Some(&0)
        };
        self.types.iter().position(|t| t.kind == kind && named(t.name)).and_then(|i| u32::try_from(i).ok())
    }

    fn name(&self, off: u32) -> &str {
        let rest = self.strings.get(off as usize..).unwrap_or(&[]);
        let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    fn ty(&self, id: u32) -> Option<&Type> {
        self.types.get(id as usize)
    }

    /// Follow typedef/const/volatile/restrict/type_tag to the underlying type id.
    fn strip(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.ty(id) {
                Some(t) if matches!(t.kind, KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG) => {
                    id = t.sot;
                }
                _ => break,
            }
        }
        id
    }

    /// Bit offset of `member` inside struct/union `id`, looking through anonymous members.
    fn find_member(&self, id: u32, member: &str, depth: u32) -> Option<(u32, u32)> {
        let t = self.ty(self.strip(id))?;
        if !matches!(t.kind, KIND_STRUCT | KIND_UNION) || depth > 8 {
            return None;
        }
        for m in &t.members {
            let name = self.name(m.name);
            if name == member {
                return Some((m.bits, m.ty));
            }
            if name.is_empty() {
                if let Some((bits, ty)) = self.find_member(m.ty, member, depth + 1) {
                    return Some((m.bits + bits, ty));
                }
            }
        }
        None
    }

    /// Byte offset of the member at `path` (e.g. `["fc_nlinfo", "portid"]`) in `struct name`.
    /// Anonymous struct/union members are looked through; an array member stands for its
    /// element 0.
    pub fn member_offset(&self, strukt: &str, path: &[&str]) -> Result<u32, BtfError> {
        let mut id = self.find(KIND_STRUCT, strukt).ok_or_else(|| BtfError::NoStruct(strukt.to_string()))?;
        let mut bits = 0u32;
        for member in path {
            let (b, ty) = self.find_member(id, member, 0).ok_or_else(|| BtfError::NoMember { strukt: strukt.to_string(), member: path.join(".") })?;
            bits += b;
            id = self.strip(ty);
            if let Some(t) = self.ty(id) {
                if t.kind == KIND_ARRAY {
                    id = self.strip(t.elem);
                }
            }
        }
        if !bits.is_multiple_of(8) {
            return Err(BtfError::Unaligned { strukt: strukt.to_string(), member: path.join("."), bits });
        }
        Ok(bits / 8)
    }

    /// C-like rendering of a type: `struct net *`, `int`, `u32`.
    fn render(&self, id: u32) -> String {
        let Some(t) = self.ty(id) else { return "?".into() };
        match t.kind {
            0 => "void".into(),
            KIND_PTR => format!("{} *", self.render(t.sot)),
            KIND_CONST => format!("const {}", self.render(t.sot)),
            KIND_VOLATILE => format!("volatile {}", self.render(t.sot)),
            KIND_STRUCT | KIND_FWD => format!("struct {}", self.name(t.name)),
            KIND_UNION => format!("union {}", self.name(t.name)),
            KIND_ENUM | KIND_ENUM64 => format!("enum {}", self.name(t.name)),
            _ => self.name(t.name).to_string(),
        }
    }

    /// Parameter types of function `func`, rendered C-like.
    pub fn function_params(&self, func: &str) -> Result<Vec<String>, BtfError> {
        let id = self.find(KIND_FUNC, func).ok_or_else(|| BtfError::NoFunction(func.to_string()))?;
        let proto = self.ty(id).and_then(|f| self.ty(f.sot)).ok_or(BtfError::Malformed("func without proto"))?;
        Ok(proto.members.iter().map(|p| self.render(p.ty)).collect())
    }

    /// Fail unless `func`'s parameters are exactly `expected`.
    pub fn check_prototype(&self, func: &str, expected: &[&str]) -> Result<(), BtfError> {
        let found = self.function_params(func)?;
        if found.iter().map(String::as_str).eq(expected.iter().copied()) {
            Ok(())
        } else {
            Err(BtfError::Prototype { func: func.into(), found: found.join(", "), expected: expected.join(", ") })
        }
    }
}

/// The prototypes the hooks were written against (see `ebpf/src/route_watch_fentry.rs`).
pub const PROTOTYPES: [(&str, &[&str]); 4] = [
    ("fib_table_insert", &["struct net *", "struct fib_table *", "struct fib_config *", "struct netlink_ext_ack *"]),
    ("fib_table_delete", &["struct net *", "struct fib_table *", "struct fib_config *", "struct netlink_ext_ack *"]),
    ("fib6_add", &["struct fib6_node *", "struct fib6_info *", "struct nl_info *", "struct netlink_ext_ack *"]),
    ("fib6_del", &["struct fib6_info *", "struct nl_info *"]),
];

/// A member (or struct) only some kernels have: [`KernelOffsets::ABSENT`] when this one does
/// not.
fn optional(found: Result<u32, BtfError>) -> Result<u32, BtfError> {
    match found {
        Err(BtfError::NoMember { .. } | BtfError::NoStruct(_)) => Ok(KernelOffsets::ABSENT),
        found => found,
    }
}

/// Check every hooked prototype and resolve every member offset the hooks read.
pub fn resolve_offsets(btf: &Btf) -> Result<KernelOffsets, BtfError> {
    for (func, params) in PROTOTYPES {
        btf.check_prototype(func, params)?;
    }
    let o = |s: &str, p: &[&str]| btf.member_offset(s, p);
    Ok(KernelOffsets {
        net_ns_inum: o("net", &["ns", "inum"])?,
        fc_dst_len: o("fib_config", &["fc_dst_len"])?,
        fc_protocol: o("fib_config", &["fc_protocol"])?,
        fc_table: o("fib_config", &["fc_table"])?,
        fc_dst: o("fib_config", &["fc_dst"])?,
        fc_priority: o("fib_config", &["fc_priority"])?,
        fc_oif: o("fib_config", &["fc_oif"])?,
        fc_gw4: o("fib_config", &["fc_gw4"])?,
        fc_nlflags: o("fib_config", &["fc_nlflags"])?,
        fc_portid: o("fib_config", &["fc_nlinfo", "portid"])?,
        f6i_table: o("fib6_info", &["fib6_table"])?,
        tb6_id: o("fib6_table", &["tb6_id"])?,
        f6i_dst_addr: o("fib6_info", &["fib6_dst", "addr"])?,
        f6i_dst_plen: o("fib6_info", &["fib6_dst", "plen"])?,
        f6i_metric: o("fib6_info", &["fib6_metric"])?,
        f6i_protocol: o("fib6_info", &["fib6_protocol"])?,
        f6i_nh_gw: o("fib6_info", &["fib6_nh", "nh_common", "nhc_gw"])?,
        f6i_nh_dev: o("fib6_info", &["fib6_nh", "nh_common", "nhc_dev"])?,
        dev_ifindex: o("net_device", &["ifindex"])?,
        nli_nlh: o("nl_info", &["nlh"])?,
        nli_portid: o("nl_info", &["portid"])?,
        nli_net: o("nl_info", &["nl_net"])?,
        // Nexthop objects (since 5.3); before, no route can go through one.
        f6i_nh: optional(o("fib6_info", &["nh"]))?,
        fc_nh_id: optional(o("fib_config", &["fc_nh_id"]))?,
        nh_id: optional(o("nexthop", &["id"]))?,
        valid: 1,
    })
}

/// The `task_struct` members the route-watch programs read the writing process at:
/// `group_leader`, then the leader's `tgid` and `comm` (`include/linux/sched.h`; plain
/// members since long before 5.11).
///
/// # Errors
/// [`BtfError::NoStruct`] / [`BtfError::NoMember`] / [`BtfError::Unaligned`] when this
/// kernel's `task_struct` does not have them as such.
pub fn resolve_task_offsets(btf: &Btf) -> Result<TaskOffsets, BtfError> {
    Ok(TaskOffsets {
        tgid: btf.member_offset("task_struct", &["tgid"])?,
        comm: btf.member_offset("task_struct", &["comm"])?,
        group_leader: btf.member_offset("task_struct", &["group_leader"])?,
        valid: 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running kernel's BTF (readable without root on this host) resolves every offset,
    /// and the values measured in toolchain.md for 6.18 match where they apply.
    #[test]
    fn resolves_offsets_from_running_kernel() {
        let Ok(btf) = Btf::from_sys() else {
            routewarden_lab::skip("resolves_offsets_from_running_kernel", format_args!("{VMLINUX_BTF} unreadable"));
            return;
        };
        let offs = resolve_offsets(&btf).expect("resolve");
        assert_eq!(offs.fc_dst_len, 0);
        assert_eq!(offs.fc_protocol, 2);
        assert_eq!(offs.valid, 1);
        assert!(offs.fc_nlflags > offs.fc_table);
        // Nexthop objects (5.3+): the pointer sits before the route's own next hops, which
        // are allocated only without an object.
        assert_ne!(offs.f6i_nh, KernelOffsets::ABSENT);
        assert!(offs.f6i_nh < offs.f6i_nh_gw && offs.f6i_nh < offs.f6i_nh_dev, "{offs:?}");
        assert_ne!(offs.fc_nh_id, KernelOffsets::ABSENT);
        // `struct nexthop` starts with its rb_node (three pointer-sized words); the id follows.
        assert!(offs.nh_id >= 24 && offs.nh_id != KernelOffsets::ABSENT, "{offs:?}");
    }

    /// A name is looked up whole (the first type of its kind with exactly that name): `net`
    /// is not `net_device`, and `ne` is neither.
    #[test]
    fn finds_a_struct_by_its_whole_name() {
        // Strings at 0 "", 1 "net_device", 12 "net", 16 "a", 18 "b", 20 "int".
        let strings = b"\0net_device\0net\0a\0b\0int\0";
        let word = |v: u32| v.to_le_bytes();
        let mut types = Vec::new();
        // 1: int, 4 bytes (the INT word: 32 bits).
        for w in [20, KIND_INT << 24, 4, 32] {
            types.extend(word(w));
        }
        // 2: struct net_device, one member: a at bit 32; 3: struct net, one member: b at 0.
        for w in [1, (KIND_STRUCT << 24) | 1, 8, 16, 1, 32, 12, (KIND_STRUCT << 24) | 1, 4, 18, 1, 0] {
            types.extend(word(w));
        }
        let mut b = Vec::new();
        for w in
            [0xeb9f_u32 | (1 << 16), 24, 0, u32::try_from(types.len()).unwrap(), u32::try_from(types.len()).unwrap(), u32::try_from(strings.len()).unwrap()]
        {
            b.extend(word(w));
        }
        b.extend(&types);
        b.extend(strings);
        let btf = Btf::parse(&b).expect("parse");
        assert_eq!(btf.member_offset("net_device", &["a"]).unwrap(), 4);
        assert_eq!(btf.member_offset("net", &["b"]).unwrap(), 0);
        assert!(matches!(btf.member_offset("ne", &["b"]), Err(BtfError::NoStruct(_))));
        assert!(matches!(btf.member_offset("net", &["a"]), Err(BtfError::NoMember { .. })));
    }

    #[test]
    fn rejects_garbage() {
        assert!(matches!(Btf::parse(b"not btf at all, clearly"), Err(BtfError::Malformed(_))));
        assert!(matches!(Btf::parse(&[0x9f, 0xeb, 1, 0, 24, 0, 0, 0]), Err(BtfError::Malformed(_))));
    }
}
