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
}

impl Default for Interner {
    fn default() -> Self {
        let mut i = Interner {
            strings: Vec::new(),
            index: FxHashMap::default(),
        };
        i.intern("");
        i
    }
}

impl Interner {
    pub const EMPTY: Sym = Sym(0);

    pub fn intern(&mut self, s: &str) -> Sym {
        if let Some(&sym) = self.index.get(s) {
            return sym;
        }
        let sym = Sym(self.strings.len() as u32);
        let boxed: Box<str> = s.into();
        self.strings.push(boxed.clone());
        self.index.insert(boxed, sym);
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
