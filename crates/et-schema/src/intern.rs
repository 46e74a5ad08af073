//! String interning: every name, type string and string value of a trace is stored once.

use rustc_hash::FxHashMap;

/// An interned string; resolve it with [`Interner::get`] or [`crate::Trace::str`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sym(pub u32);

/// An append-only string table. `Sym(0)` is always the empty string.
#[derive(Clone, Debug)]
pub struct Interner {
    strings: Vec<Box<str>>,
    index: FxHashMap<Box<str>, Sym>,
    /// Direct-mapped cache of short strings (devices, `Int`, `None`, ...), which make up most
    /// lookups: one multiply instead of hashing and probing the map.
    short: Box<[(u64, u32); 256]>,
}

impl Default for Interner {
    fn default() -> Self {
        let mut i = Interner {
            strings: Vec::new(),
            index: FxHashMap::default(),
            // u64::MAX never matches: a real key's top byte is its length, at most 7.
            short: Box::new([(u64::MAX, 0); 256]),
        };
        i.intern("");
        i
    }
}

impl Interner {
    pub const EMPTY: Sym = Sym(0);

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

    pub fn get(&self, sym: Sym) -> &str {
        &self.strings[sym.0 as usize]
    }

    pub fn len(&self) -> usize {
        self.strings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.strings.len() <= 1
    }

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
