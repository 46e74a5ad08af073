//! Reading limits that need the whole process: the largest single allocation (a counting
//! allocator) and the environment variable. One test, so nothing runs beside it.

use et_schema::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

struct Largest;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LARGEST.fetch_max(new, Ordering::Relaxed);
        System.realloc(p, l, new)
    }
}

#[global_allocator]
static ALLOC: Largest = Largest;

fn gz(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

#[test]
fn gzip_trailers_and_limits_from_the_environment() {
    // A 32-byte gzip file whose trailer (ISIZE) claims 4 GiB: reserving that much up front
    // would abort under an address-space limit. The claim is only a hint: the file is an
    // error, and nothing near the claim is allocated.
    let mut small = gz(br#"{"nodes":[]}"#);
    let n = small.len();
    small[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(small.len() <= 40, "{}", small.len());
    LARGEST.store(0, Ordering::Relaxed);
    let r = decompress(small, "claims4g.json.gz");
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        largest < 1 << 20,
        "allocated {largest} bytes for a 4 GiB claim"
    );
    assert!(matches!(r, Err(Error::Gzip { .. })), "{r:?}");

    // A trailer that claims less than the truth is only a hint too.
    let data = vec![b' '; 3 << 20];
    let mut lying = gz(&data);
    let n = lying.len();
    lying[n - 4..].copy_from_slice(&1u32.to_le_bytes());
    assert!(decompress(lying, "lying.json.gz").is_err());

    // The environment variable sets the limit when the caller does not.
    let bomb = gz(&vec![0u8; 4 << 20]);
    std::env::set_var(MAX_DECOMPRESSED_ENV, "1M");
    let e = decompress(bomb.clone(), "bomb.gz").unwrap_err();
    assert!(
        matches!(e, Error::DecompressedTooLarge { limit, .. } if limit == 1 << 20),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains("MYSTIQUE_MAX_DECOMPRESSED=1M"), "{msg}");
    // An explicit option wins over the environment.
    let ro = ReadOptions {
        max_decompressed: Some(4 << 20),
    };
    assert_eq!(
        decompress_with(bomb.clone(), "bomb.gz", &ro).unwrap().len(),
        4 << 20
    );
    std::env::set_var(MAX_DECOMPRESSED_ENV, "lots");
    let e = decompress(bomb.clone(), "bomb.gz").unwrap_err();
    assert!(matches!(e, Error::BadLimit { .. }), "{e}");
    assert!(e.to_string().contains("\"lots\""), "{e}");
    // Plain JSON is not decompressed, so no limit applies to it.
    assert!(decompress(b"{}".to_vec(), "plain.json").is_ok());
    std::env::remove_var(MAX_DECOMPRESSED_ENV);
    assert_eq!(decompress(bomb, "bomb.gz").unwrap().len(), 4 << 20);
}
