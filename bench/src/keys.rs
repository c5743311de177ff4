//! Key generation for the write workloads: which key a client writes next.
//!
//! A key is an optional prefix followed by the key index as zero-padded
//! decimal of a fixed width (`--key-size`): index 42 with width 8 is
//! `00000042`, under the prefix `/registry/pods/` it is
//! `/registry/pods/00000042`. The format is predictable so a later `range`
//! (or etcdctl) can find what a run wrote.
//!
//! Indices are either random in `0..key_space` (xorshift, per client,
//! deterministic) or sequential `0, 1, 2, ..` across all the clients of a
//! run, which share one counter (all clients run on one executor), wrapping
//! around after `key_space` keys.

use std::cell::Cell;
use std::rc::Rc;

/// Number of decimal digits of `n` (1 for 0).
pub fn digits(n: u64) -> usize {
    let mut d = 1;
    let mut n = n / 10;
    while n > 0 {
        d += 1;
        n /= 10;
    }
    d
}

/// `prefix` followed by `index` zero-padded to `width` digits.
pub fn format_key(prefix: &[u8], index: u64, width: usize) -> Vec<u8> {
    let mut key = Vec::with_capacity(prefix.len() + width.max(20));
    key.extend_from_slice(prefix);
    key.extend_from_slice(format!("{index:0width$}").as_bytes());
    key
}

/// xorshift64: cheap, deterministic per client, good enough for key choice.
pub fn next_rand(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// A non-zero xorshift seed for client `client`.
pub fn seed(client: usize) -> u64 {
    (client as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// What a [`KeyGen`] generates; unlike the generator (whose sequential
/// counter is shared in place), it can be sent to the load executor.
#[derive(Clone, Debug)]
pub struct KeySpec {
    pub prefix: Vec<u8>,
    pub width: usize,
    pub space: u64,
    pub sequential: bool,
}

impl KeySpec {
    /// A fresh generator (checked as [`KeyGen::new`]).
    pub fn build(&self) -> Result<KeyGen, String> {
        KeyGen::new(&self.prefix, self.width, self.space, self.sequential)
    }
}

#[derive(Clone)]
enum Order {
    Random(u64),
    /// Shared by every client of a run.
    Sequential(Rc<Cell<u64>>),
}

/// One client's key source. Clones of a sequential generator share its
/// counter; use [`KeyGen::for_client`] to give each client its own random
/// stream.
#[derive(Clone)]
pub struct KeyGen {
    prefix: Vec<u8>,
    width: usize,
    space: u64,
    order: Order,
}

impl KeyGen {
    /// Keys `prefix` + index in `0..space`, `width` digits. Fails when an
    /// index of the key space does not fit in `width` digits (the keys
    /// would not be of fixed width).
    pub fn new(
        prefix: &[u8],
        width: usize,
        space: u64,
        sequential: bool,
    ) -> Result<KeyGen, String> {
        if space == 0 {
            return Err("--key-space-size must be at least 1".into());
        }
        let need = digits(space - 1);
        if width < need {
            return Err(format!(
                "--key-size {width} is too small for --key-space-size {space}: keys are zero-padded decimal and need {need} digits"
            ));
        }
        Ok(KeyGen {
            prefix: prefix.to_vec(),
            width,
            space,
            order: if sequential {
                Order::Sequential(Rc::new(Cell::new(0)))
            } else {
                Order::Random(seed(0))
            },
        })
    }

    /// The generator of client `client`: the shared counter if sequential,
    /// an independent random stream otherwise.
    pub fn for_client(&self, client: usize) -> KeyGen {
        let mut g = self.clone();
        if let Order::Random(_) = g.order {
            g.order = Order::Random(seed(client));
        }
        g
    }

    /// The next key index, in `0..space`.
    pub fn next_index(&mut self) -> u64 {
        match &mut self.order {
            Order::Random(state) => next_rand(state) % self.space,
            Order::Sequential(counter) => {
                let i = counter.get();
                counter.set(i.wrapping_add(1));
                i % self.space
            }
        }
    }

    /// The next key.
    pub fn next_key(&mut self) -> Vec<u8> {
        let i = self.next_index();
        format_key(&self.prefix, i, self.width)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn digits_counts_decimal_digits() {
        assert_eq!(digits(0), 1);
        assert_eq!(digits(9), 1);
        assert_eq!(digits(10), 2);
        assert_eq!(digits(99_999), 5);
        assert_eq!(digits(100_000), 6);
        assert_eq!(digits(u64::MAX), 20);
    }

    #[test]
    fn keys_are_fixed_width_zero_padded() {
        assert_eq!(format_key(b"", 42, 8), b"00000042");
        assert_eq!(format_key(b"/p/", 7, 3), b"/p/007");
        let mut g = KeyGen::new(b"", 8, 100_000, false).unwrap();
        for _ in 0..1000 {
            let k = g.next_key();
            assert_eq!(k.len(), 8);
            assert!(k.iter().all(u8::is_ascii_digit));
        }
    }

    #[test]
    fn random_keys_stay_in_key_space() {
        let g = KeyGen::new(b"", 4, 37, false).unwrap();
        for c in 0..5 {
            let mut g = g.for_client(c);
            for _ in 0..1000 {
                let k = g.next_key();
                let n: u64 = std::str::from_utf8(&k).unwrap().parse().unwrap();
                assert!(n < 37);
            }
        }
    }

    #[test]
    fn random_clients_get_different_streams() {
        let g = KeyGen::new(b"", 8, 100_000, false).unwrap();
        let mut c0 = g.for_client(0);
        let a: Vec<u64> = (0..10).map(|_| c0.next_index()).collect();
        let mut c1 = g.for_client(1);
        let b: Vec<u64> = (0..10).map(|_| c1.next_index()).collect();
        assert_ne!(a, b);
    }

    #[test]
    fn sequential_keys_are_in_order_across_clients_without_repeats() {
        let g = KeyGen::new(b"/k/", 3, 500, true).unwrap();
        let mut clients: Vec<KeyGen> = (0..7).map(|c| g.for_client(c)).collect();
        let mut seen = HashSet::new();
        for i in 0..500u64 {
            let k = clients[(i as usize * 3) % 7].next_key();
            assert_eq!(k, format_key(b"/k/", i, 3));
            assert!(seen.insert(k));
        }
        // After the key space, the sequence wraps around.
        assert_eq!(clients[0].next_key(), b"/k/000");
    }

    #[test]
    fn too_narrow_width_is_an_error() {
        assert!(KeyGen::new(b"", 4, 100_000, false).is_err());
        assert!(KeyGen::new(b"", 5, 100_000, false).is_ok());
        assert!(KeyGen::new(b"", 8, 0, false).is_err());
    }
}
