//! String interning: every name, type string and string value of a trace is stored once.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

/// An interned string; resolve it with [`Interner::get`] or [`crate::Trace::str`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sym(pub u32);

/// An append-only string table. `Sym(0)` is always the empty string.
#[derive(Clone, Debug)]
pub struct Interner {
    strings: Vec<Box<str>>,
    /// Keyed per process: a crafted trace cannot make its strings collide (with FxHash, 48-byte
    /// strings whose third 8 bytes cancel the state all hash alike, and interning N of them
    /// takes N^2 probes: 12 s for 20,000).
    index: HashMap<Box<str>, Sym, KeyedState>,
    /// Direct-mapped cache of short strings (devices, `Int`, `None`, ...), which make up most
    /// lookups: one multiply instead of hashing and probing the map.
    short: Box<[(u64, u32); 256]>,
}

impl Default for Interner {
    fn default() -> Self {
        let mut i = Interner {
            strings: Vec::new(),
            index: HashMap::with_hasher(KeyedState::new()),
            // u64::MAX never matches: a real key's top byte is its length, at most 7.
            short: Box::new([(u64::MAX, 0); 256]),
        };
        i.intern("");
        i
    }
}

impl Interner {
    /// The empty string, interned in every table.
    pub const EMPTY: Sym = Sym(0);

    /// The symbol of `s`, added if new.
    pub fn intern(&mut self, s: &str) -> Sym {
        // Strings of at most 7 bytes pack with their length into a u64 that identifies them.
        let key = (s.len() < 8).then(|| {
            let mut b = [0u8; 8];
            b[..s.len()].copy_from_slice(s.as_bytes());
            b[7] = s.len() as u8;
            u64::from_le_bytes(b)
        });
        let slot = key.map(|k| (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize);
        if let (Some(k), Some(i)) = (key, slot) {
            let (ck, sym) = self.short[i];
            if ck == k {
                return Sym(sym);
            }
        }
        if let Some(&sym) = self.index.get(s) {
            if let (Some(k), Some(i)) = (key, slot) {
                self.short[i] = (k, sym.0);
            }
            return sym;
        }
        let sym = Sym(self.strings.len() as u32);
        let boxed: Box<str> = s.into();
        self.strings.push(boxed.clone());
        self.index.insert(boxed, sym);
        if let (Some(k), Some(i)) = (key, slot) {
            self.short[i] = (k, sym.0);
        }
        sym
    }

    /// Looks a string up without adding it.
    pub fn lookup(&self, s: &str) -> Option<Sym> {
        self.index.get(s).copied()
    }

    /// The string of `sym` (from this table).
    pub fn get(&self, sym: Sym) -> &str {
        &self.strings[sym.0 as usize]
    }

    /// Strings held, the empty one included.
    pub fn len(&self) -> usize {
        self.strings.len()
    }

    /// Whether it holds only the empty string.
    pub fn is_empty(&self) -> bool {
        self.strings.len() <= 1
    }

    /// Every symbol and its string, in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = (Sym, &str)> {
        self.strings
            .iter()
            .enumerate()
            .map(|(i, s)| (Sym(i as u32), &**s))
    }

    /// Heap bytes held (approximate), for memory reports.
    pub fn heap_bytes(&self) -> usize {
        self.strings.iter().map(|s| s.len() * 2 + 48).sum()
    }
}

/// The interner's hash: a folded multiply per 16 bytes, as fast as FxHash on the short strings
/// traces are made of, but starting from a random key (taken from std's `RandomState`), so
/// that colliding strings cannot be computed in advance: the minimal resistance to hash
/// flooding that a parser of untrusted files needs. Other crates key their maps of
/// file-chosen values (ids, storages) with it too.
#[derive(Clone, Debug)]
pub struct KeyedState {
    k0: u64,
    k1: u64,
}

impl Default for KeyedState {
    fn default() -> Self {
        KeyedState::new()
    }
}

impl KeyedState {
    /// A hasher state with a key of its own.
    pub fn new() -> Self {
        let r = std::collections::hash_map::RandomState::new();
        KeyedState {
            k0: r.hash_one(0x243f_6a88_85a3_08d3u64),
            k1: r.hash_one(0x1319_8a2e_0370_7344u64),
        }
    }
}

impl BuildHasher for KeyedState {
    type Hasher = KeyedHasher;
    fn build_hasher(&self) -> KeyedHasher {
        KeyedHasher {
            s0: self.k0,
            s1: self.k1,
        }
    }
}

pub struct KeyedHasher {
    s0: u64,
    s1: u64,
}

#[inline]
fn folded_multiply(x: u64, y: u64) -> u64 {
    let full = (x as u128).wrapping_mul(y as u128);
    (full as u64) ^ ((full >> 64) as u64)
}

const MIX: u64 = 0xa409_3822_299f_31d0;

impl Hasher for KeyedHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(16);
        for c in &mut chunks {
            let (x, y) = c.split_at(8);
            let x = u64::from_le_bytes(x.try_into().unwrap_or_default());
            let y = u64::from_le_bytes(y.try_into().unwrap_or_default());
            let t = folded_multiply(self.s0 ^ x, self.s1 ^ y ^ MIX);
            self.s0 = self.s1;
            self.s1 = t;
        }
        let rest = chunks.remainder();
        let mut buf = [0u8; 16];
        buf[..rest.len()].copy_from_slice(rest);
        let x = u64::from_le_bytes(buf[..8].try_into().unwrap_or_default());
        let y = u64::from_le_bytes(buf[8..].try_into().unwrap_or_default());
        // The length goes in with the last bytes, so that zero padding is not ambiguous.
        let t = folded_multiply(
            self.s0 ^ x ^ (bytes.len() as u64).rotate_left(32),
            self.s1 ^ y ^ MIX,
        );
        self.s0 = self.s1;
        self.s1 = t;
    }

    /// Integers (ids, interned symbols) in one multiply, not through the byte path.
    #[inline]
    fn write_u64(&mut self, x: u64) {
        let t = folded_multiply(self.s0 ^ x, self.s1 ^ MIX);
        self.s0 = self.s1;
        self.s1 = t;
    }

    #[inline]
    fn write_u32(&mut self, x: u32) {
        self.write_u64(x as u64)
    }

    #[inline]
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64)
    }

    #[inline]
    fn finish(&self) -> u64 {
        folded_multiply(self.s0 ^ MIX, self.s1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hash table whose probes all collide is quadratic; with the keyed hash, strings built to
    /// collide under FxHash spread like any others.
    #[test]
    fn strings_made_to_collide_under_fxhash_do_not_collide_here() {
        const SEED1: u64 = 0x243f_6a88_85a3_08d3;
        const P: u64 = 0xa409_3822_299f_31d0;
        // rustc-hash 2's string hash: after two 16-byte chunks its state s0 is the mix of the
        // first one; 8 bytes equal to that mix zero it, and every such string hashes to its length.
        let mut seed = 1u64;
        let (chunk, t1) = loop {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let mut c = [0u8; 16];
            for (i, b) in c.iter_mut().enumerate() {
                *b = b'a' + ((seed >> (i * 4 % 60)) as u8 % 26);
            }
            let x = u64::from_le_bytes(c[..8].try_into().unwrap());
            let y = u64::from_le_bytes(c[8..].try_into().unwrap());
            let t1 = folded_multiply(SEED1 ^ x, P ^ y);
            if t1
                .to_le_bytes()
                .iter()
                .all(|b| (0x20..0x7f).contains(b) && *b != b'"' && *b != b'\\')
            {
                break (c, t1);
            }
        };
        let mk = |j: u64| -> String {
            let mut s = Vec::new();
            s.extend_from_slice(&chunk);
            s.extend_from_slice(b"0123456789abcdef");
            s.extend_from_slice(&t1.to_le_bytes());
            s.extend_from_slice(format!("{j:08}").as_bytes());
            String::from_utf8(s).unwrap()
        };
        let fx: std::collections::HashSet<u64> = (0..1000)
            .map(|j| rustc_hash::FxBuildHasher.hash_one(mk(j).as_str()))
            .collect();
        assert_eq!(fx.len(), 1, "the crafted strings collide under FxHash");
        let keyed = KeyedState::new();
        let ours: std::collections::HashSet<u64> =
            (0..1000).map(|j| keyed.hash_one(mk(j).as_str())).collect();
        assert_eq!(ours.len(), 1000);
        // And interning many of them stays linear (FxHash takes 12 s for 20,000).
        let mut i = Interner::default();
        for j in 0..50_000 {
            i.intern(&mk(j));
        }
        assert_eq!(i.len(), 50_001);
        assert_eq!(i.lookup(&mk(7)), Some(Sym(8)));
    }

    #[test]
    fn keyed_hash_tells_apart_prefixes_and_padding() {
        let k = KeyedState::new();
        let h = |s: &[u8]| k.hash_one(s);
        let set: std::collections::HashSet<u64> = [
            &b""[..],
            b"\0",
            b"\0\0",
            b"a",
            b"a\0",
            b"0123456789abcdef",
            b"0123456789abcdef\0",
        ]
        .iter()
        .map(|s| h(s))
        .collect();
        assert_eq!(set.len(), 7);
    }
}
