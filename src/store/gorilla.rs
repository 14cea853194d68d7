//! Compressed chunks of points, after Facebook's Gorilla (VLDB 2015): timestamps as
//! delta-of-delta in variable-width buckets, floats XOR-ed with the previous value.
//! Integers (raw register values; scale is applied when reading) use delta-of-delta like
//! timestamps; booleans take one bit; texts one bit when unchanged. Quality takes one bit
//! when unchanged.
//!
//! A [`ChunkWriter`] can be snapshotted ([`ChunkWriter::bytes`]) and appended to again, so
//! the open chunk of a sensor is flushed as it grows.

/// Bits, most significant first.
#[derive(Clone, Default)]
struct BitWriter {
    bytes: Vec<u8>,
    /// Bits used in the last byte (0 = the last byte is full or there is none).
    used: u8,
}

impl BitWriter {
    fn push(&mut self, value: u64, bits: u8) {
        for i in (0..bits).rev() {
            if self.used == 0 {
                // An open chunk lives in memory while it grows (a hub holds 100,000):
                // grown by an eighth, not doubled, its spare room stays small.
                if self.bytes.len() == self.bytes.capacity() {
                    self.bytes.reserve_exact((self.bytes.len() / 8).max(16));
                }
                self.bytes.push(0);
            }
            let bit = ((value >> i) & 1) as u8;
            let last = self.bytes.len() - 1;
            self.bytes[last] |= bit << (7 - self.used);
            self.used = (self.used + 1) % 8;
        }
    }

    fn bit(&mut self, b: bool) {
        self.push(u64::from(b), 1);
    }
}

struct BitReader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl BitReader<'_> {
    fn read(&mut self, bits: u8) -> Option<u64> {
        let mut v = 0u64;
        for _ in 0..bits {
            let byte = *self.bytes.get(self.pos / 8)?;
            let bit = (byte >> (7 - (self.pos % 8))) & 1;
            v = (v << 1) | u64::from(bit);
            self.pos += 1;
        }
        Some(v)
    }

    fn bit(&mut self) -> Option<bool> {
        self.read(1).map(|b| b == 1)
    }
}

/// A stored value before scaling.
#[derive(Debug, Clone, PartialEq)]
pub enum Stored {
    Float(f64),
    Int(i64),
    /// An unsigned 64-bit integer (a `u64` register, an OPC UA UInt64): exact above 2^63.
    UInt(u64),
    Bool(bool),
    Text(String),
}

/// Quality of a stored point: 0 good, 1 uncertain, 2 bad.
pub type Quality = u8;

#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// Milliseconds since the Unix epoch.
    pub t: i64,
    pub value: Stored,
    pub quality: Quality,
}

/// What kind of values a chunk holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Float = 0,
    Int = 1,
    Bool = 2,
    Text = 3,
    /// Unsigned integers: the `Int` encoding of the same 64 bits.
    UInt = 4,
}

impl Kind {
    pub fn of(v: &Stored) -> Kind {
        match v {
            Stored::Float(_) => Kind::Float,
            Stored::Int(_) => Kind::Int,
            Stored::UInt(_) => Kind::UInt,
            Stored::Bool(_) => Kind::Bool,
            Stored::Text(_) => Kind::Text,
        }
    }
}

/// Signed value in variable-width buckets: `0` for zero, then `10`+7, `110`+9, `1110`+12,
/// `11110`+20 and `11111`+64 bits.
fn put_varbits(w: &mut BitWriter, v: i64) {
    const B: [(u64, u8, u8); 4] = [(0b10, 2, 7), (0b110, 3, 9), (0b1110, 4, 12), (0b11110, 5, 20)];
    if v == 0 {
        w.bit(false);
        return;
    }
    for (prefix, plen, bits) in B {
        let half = 1i64 << (bits - 1);
        if v > -half && v <= half {
            w.push(prefix, plen);
            w.push((v + half - 1) as u64, bits);
            return;
        }
    }
    w.push(0b11111, 5);
    w.push(v as u64, 64);
}

fn get_varbits(r: &mut BitReader<'_>) -> Option<i64> {
    let mut ones = 0u8;
    while ones < 5 && r.bit()? {
        ones += 1;
    }
    let bits = match ones {
        0 => return Some(0),
        1 => 7,
        2 => 9,
        3 => 12,
        4 => 20,
        _ => return r.read(64).map(|v| v as i64),
    };
    let half = 1i64 << (bits - 1);
    Some(r.read(bits)? as i64 - half + 1)
}

const HEADER: usize = 1 + 4 + 8;

/// Builds one chunk, point by point.
#[derive(Clone)]
pub struct ChunkWriter {
    kind: Kind,
    bits: BitWriter,
    count: u32,
    first_t: i64,
    last_t: i64,
    prev_delta: i64,
    prev_bits: u64,
    prev_int: i64,
    prev_int_delta: i64,
    leading: u8,
    trailing: u8,
    prev_quality: Quality,
    prev_text: String,
}

impl ChunkWriter {
    pub fn new(kind: Kind) -> ChunkWriter {
        ChunkWriter {
            kind,
            bits: BitWriter::default(),
            count: 0,
            first_t: 0,
            last_t: 0,
            prev_delta: 0,
            prev_bits: 0,
            prev_int: 0,
            prev_int_delta: 0,
            leading: u8::MAX,
            trailing: 0,
            prev_quality: 0,
            prev_text: String::new(),
        }
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }
    pub fn len(&self) -> u32 {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    pub fn first_t(&self) -> i64 {
        self.first_t
    }
    pub fn last_t(&self) -> i64 {
        self.last_t
    }

    /// Appends a point with a time after the last one's. A value of another kind than the
    /// chunk's is stored as a bad-quality placeholder rather than corrupting the chunk.
    pub fn push(&mut self, p: &Point) {
        if Kind::of(&p.value) != self.kind {
            let value = match self.kind {
                Kind::Float => Stored::Float(f64::NAN),
                Kind::Int => Stored::Int(self.prev_int),
                Kind::UInt => Stored::UInt(self.prev_int as u64),
                Kind::Bool => Stored::Bool(false),
                Kind::Text => Stored::Text(String::new()),
            };
            return self.push(&Point { t: p.t, value, quality: 2 });
        }
        let w = &mut self.bits;
        if self.count == 0 {
            self.first_t = p.t;
        } else {
            let delta = p.t - self.last_t;
            put_varbits(w, delta - self.prev_delta);
            self.prev_delta = delta;
        }
        self.last_t = p.t;
        if p.quality == self.prev_quality && self.count > 0 {
            w.bit(false);
        } else {
            w.bit(true);
            w.push(u64::from(p.quality.min(3)), 2);
            self.prev_quality = p.quality;
        }
        match (&p.value, self.kind) {
            (Stored::Float(f), Kind::Float) => {
                let bits = f.to_bits();
                if self.count == 0 {
                    w.push(bits, 64);
                } else {
                    let x = bits ^ self.prev_bits;
                    if x == 0 {
                        w.bit(false);
                    } else {
                        w.bit(true);
                        let lead = (x.leading_zeros() as u8).min(31);
                        let trail = x.trailing_zeros() as u8;
                        if self.leading != u8::MAX && lead >= self.leading && trail >= self.trailing {
                            w.bit(false);
                            let len = 64 - self.leading - self.trailing;
                            w.push(x >> self.trailing, len);
                        } else {
                            w.bit(true);
                            let len = 64 - lead - trail;
                            w.push(u64::from(lead), 5);
                            w.push(u64::from(len - 1), 6);
                            w.push(x >> trail, len);
                            self.leading = lead;
                            self.trailing = trail;
                        }
                    }
                }
                self.prev_bits = bits;
            }
            (Stored::Int(_), Kind::Int) | (Stored::UInt(_), Kind::UInt) => {
                let i = &match p.value {
                    Stored::UInt(u) => u as i64,
                    Stored::Int(i) => i,
                    _ => self.prev_int,
                };
                if self.count == 0 {
                    w.push(*i as u64, 64);
                } else {
                    let delta = i.wrapping_sub(self.prev_int);
                    put_varbits(w, delta.wrapping_sub(self.prev_int_delta));
                    self.prev_int_delta = delta;
                }
                self.prev_int = *i;
            }
            (Stored::Bool(b), Kind::Bool) => w.bit(*b),
            (Stored::Text(t), Kind::Text) => {
                if self.count > 0 && *t == self.prev_text {
                    w.bit(false);
                } else {
                    w.bit(true);
                    // History keeps a text's first 65,535 bytes, cut where a character ends.
                    let bytes = &t.as_bytes()[..t.floor_char_boundary(MAX_TEXT_BYTES)];
                    w.push(bytes.len() as u64, 16);
                    for b in bytes {
                        w.push(u64::from(*b), 8);
                    }
                    self.prev_text = t.clone();
                }
            }
            // The caller keeps one kind per chunk; `push` replaced a mismatch already.
            _ => {}
        }
        self.count += 1;
    }

    /// How many bytes [`ChunkWriter::bytes`] returns.
    pub fn byte_len(&self) -> usize {
        HEADER + self.bits.bytes.len()
    }

    /// The chunk as stored: header (kind, count, first time) then the bits.
    pub fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.bits.bytes.len());
        out.push(self.kind as u8);
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.first_t.to_le_bytes());
        out.extend_from_slice(&self.bits.bytes);
        out
    }
}

/// The most points a chunk holds.
pub const MAX_COUNT: u32 = 1024;

/// The longest text a point keeps (its length is stored in 16 bits): a longer one keeps
/// its first characters that fit.
pub const MAX_TEXT_BYTES: usize = u16::MAX as usize;

/// A stored chunk could not be decoded (a corrupt or foreign value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("corrupt history chunk")]
pub struct Corrupt;

/// How many points a stored chunk holds, read from its header.
pub fn count_of(bytes: &[u8]) -> Result<u32, Corrupt> {
    bytes.get(1..5).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes).ok_or(Corrupt)
}

/// Every point of a stored chunk.
pub fn decode(bytes: &[u8]) -> Result<Vec<Point>, Corrupt> {
    if bytes.len() < HEADER {
        return Err(Corrupt);
    }
    let kind = match bytes[0] {
        0 => Kind::Float,
        1 => Kind::Int,
        2 => Kind::Bool,
        3 => Kind::Text,
        4 => Kind::UInt,
        _ => return Err(Corrupt),
    };
    let count = u32::from_le_bytes(bytes[1..5].try_into().map_err(|_| Corrupt)?);
    // No chunk holds more (the store seals one at 1,024): a count beyond is a chunk
    // someone made, and decoding it could take gigabytes.
    if count > MAX_COUNT {
        return Err(Corrupt);
    }
    let first_t = i64::from_le_bytes(bytes[5..13].try_into().map_err(|_| Corrupt)?);
    let mut r = BitReader { bytes: &bytes[HEADER..], pos: 0 };
    let mut out = Vec::with_capacity(count.min(1 << 16) as usize);
    let (mut t, mut delta) = (first_t, 0i64);
    let (mut prev_bits, mut leading, mut trailing) = (0u64, 0u8, 0u8);
    let (mut prev_int, mut int_delta) = (0i64, 0i64);
    let mut quality = 0u8;
    let mut text = String::new();
    for i in 0..count {
        if i > 0 {
            delta = delta.checked_add(get_varbits(&mut r).ok_or(Corrupt)?).ok_or(Corrupt)?;
            t = t.checked_add(delta).ok_or(Corrupt)?;
        }
        if r.bit().ok_or(Corrupt)? {
            quality = r.read(2).ok_or(Corrupt)? as u8;
        }
        let value = match kind {
            Kind::Float => {
                if i == 0 {
                    prev_bits = r.read(64).ok_or(Corrupt)?;
                } else if r.bit().ok_or(Corrupt)? {
                    if r.bit().ok_or(Corrupt)? {
                        leading = r.read(5).ok_or(Corrupt)? as u8;
                        let len = r.read(6).ok_or(Corrupt)? as u8 + 1;
                        trailing = 64u8.checked_sub(leading + len).ok_or(Corrupt)?;
                    }
                    let len = 64 - leading - trailing;
                    prev_bits ^= r.read(len).ok_or(Corrupt)? << trailing;
                }
                Stored::Float(f64::from_bits(prev_bits))
            }
            Kind::Int | Kind::UInt => {
                if i == 0 {
                    prev_int = r.read(64).ok_or(Corrupt)? as i64;
                } else {
                    int_delta = int_delta.wrapping_add(get_varbits(&mut r).ok_or(Corrupt)?);
                    prev_int = prev_int.wrapping_add(int_delta);
                }
                if kind == Kind::UInt { Stored::UInt(prev_int as u64) } else { Stored::Int(prev_int) }
            }
            Kind::Bool => Stored::Bool(r.bit().ok_or(Corrupt)?),
            Kind::Text => {
                if r.bit().ok_or(Corrupt)? {
                    let len = r.read(16).ok_or(Corrupt)? as usize;
                    let mut b = Vec::with_capacity(len);
                    for _ in 0..len {
                        b.push(r.read(8).ok_or(Corrupt)? as u8);
                    }
                    text = String::from_utf8_lossy(&b).into_owned();
                }
                Stored::Text(text.clone())
            }
        };
        out.push(Point { t, value, quality });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    /// An open chunk grows by an eighth at a time: its spare room stays small.
    #[test]
    fn a_growing_chunk_keeps_little_spare_room() {
        let mut w = BitWriter::default();
        for k in 0..20_000u64 {
            w.push(k.wrapping_mul(0x9e37_79b9_7f4a_7c15), 13);
            assert!(
                w.bytes.capacity() <= w.bytes.len() + w.bytes.len() / 8 + 16,
                "at {} bytes",
                w.bytes.len()
            );
        }
    }

    use super::*;
    use proptest::prelude::*;

    fn roundtrip(points: &[Point]) {
        let mut w = ChunkWriter::new(Kind::of(&points[0].value));
        for p in points {
            w.push(p);
        }
        let got = decode(&w.bytes()).unwrap();
        assert_eq!(got.len(), points.len());
        for (g, p) in got.iter().zip(points) {
            assert_eq!(g.t, p.t);
            assert_eq!(g.quality, p.quality);
            match (&g.value, &p.value) {
                (Stored::Float(a), Stored::Float(b)) => assert_eq!(a.to_bits(), b.to_bits()),
                (a, b) => assert_eq!(a, b),
            }
        }
    }

    fn times(start: i64, gaps: &[i64]) -> Vec<i64> {
        let mut t = start;
        gaps.iter()
            .map(|g| {
                t += g;
                t
            })
            .collect()
    }

    proptest! {
        #[test]
        fn floats_round_trip(start in -1i64<<40..1i64<<42, gaps in prop::collection::vec(prop_oneof![Just(1000i64), 1i64..5000, 1i64..1i64<<36], 1..400),
                              vals in prop::collection::vec(prop_oneof![any::<f64>(), Just(0.0), Just(42.5), -1e6f64..1e6], 400), q in prop::collection::vec(0u8..3, 400)) {
            let ts = times(start, &gaps);
            let points: Vec<Point> = ts.iter().enumerate().map(|(i, t)| Point { t: *t, value: Stored::Float(vals[i % vals.len()]), quality: q[i % q.len()] }).collect();
            roundtrip(&points);
        }

        #[test]
        fn equal_values_and_large_jumps_round_trip(n in 1usize..300, v in any::<f64>(), jump in any::<f64>()) {
            let points: Vec<Point> = (0..n).map(|i| Point { t: i as i64 * 1000, value: Stored::Float(if i % 50 == 49 { jump } else { v }), quality: 0 }).collect();
            roundtrip(&points);
        }

        #[test]
        fn ints_round_trip(start in any::<i32>(), gaps in prop::collection::vec(1i64..100_000, 1..300), vals in prop::collection::vec(prop_oneof![any::<i64>(), -1000i64..1000], 300)) {
            let ts = times(i64::from(start), &gaps);
            let points: Vec<Point> = ts.iter().enumerate().map(|(i, t)| Point { t: *t, value: Stored::Int(vals[i]), quality: 0 }).collect();
            roundtrip(&points);
        }

        #[test]
        fn unsigned_ints_round_trip_exactly(vals in prop::collection::vec(prop_oneof![any::<u64>(), Just(u64::MAX), Just(1u64 << 63), 0u64..1000], 1..300)) {
            let points: Vec<Point> = vals.iter().enumerate().map(|(i, v)| Point { t: i as i64 * 1000, value: Stored::UInt(*v), quality: 0 }).collect();
            roundtrip(&points);
        }

        #[test]
        fn bools_and_texts_round_trip(bs in prop::collection::vec(any::<bool>(), 1..200), texts in prop::collection::vec(prop_oneof![Just("A".to_string()), "[ -~]{0,20}"], 1..200)) {
            let points: Vec<Point> = bs.iter().enumerate().map(|(i, b)| Point { t: i as i64 * 7, value: Stored::Bool(*b), quality: 0 }).collect();
            roundtrip(&points);
            let points: Vec<Point> = texts.iter().enumerate().map(|(i, s)| Point { t: i as i64 * 1000, value: Stored::Text(s.clone()), quality: (i % 3) as u8 }).collect();
            roundtrip(&points);
        }

        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
            let _ = decode(&bytes);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// A real chunk damaged on disk (bits flipped, cut short, grown): decoding it never
        /// panics, and never yields more points than its bytes can hold.
        #[test]
        fn damaged_chunks_never_panic(
            kind in 0u8..4,
            n in 1usize..300,
            flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 0..6),
            cut in any::<prop::sample::Index>(),
            tail in prop::collection::vec(any::<u8>(), 0..16),
        ) {
            let value = |i: usize| match kind {
                0 => Stored::Float(i as f64 * 0.37 - 5.0),
                1 => Stored::Int(i as i64 * 1009 - 50_000),
                2 => Stored::Bool(i.is_multiple_of(3)),
                _ => Stored::Text(format!("T{i}")),
            };
            let mut w = ChunkWriter::new(Kind::of(&value(0)));
            for i in 0..n {
                w.push(&Point { t: i as i64 * 997, value: value(i), quality: (i % 3) as u8 });
            }
            let mut bytes = w.bytes();
            for (at, bit) in &flips {
                let i = at.index(bytes.len());
                bytes[i] ^= 1 << bit;
            }
            bytes.truncate(cut.index(bytes.len() + 1));
            bytes.extend_from_slice(&tail);
            if let Ok(points) = decode(&bytes) {
                prop_assert!(points.len() <= bytes.len() * 8 + 1, "{} points from {} bytes", points.len(), bytes.len());
            }
        }
    }

    #[test]
    fn a_snapshot_can_be_appended_to_again() {
        let mut w = ChunkWriter::new(Kind::Float);
        for i in 0..10 {
            w.push(&Point { t: i * 1000, value: Stored::Float(i as f64), quality: 0 });
        }
        let first = w.bytes();
        for i in 10..20 {
            w.push(&Point { t: i * 1000, value: Stored::Float(i as f64), quality: 0 });
        }
        assert_eq!(decode(&first).unwrap().len(), 10);
        assert_eq!(decode(&w.bytes()).unwrap().len(), 20);
    }

    #[test]
    fn regular_flat_series_take_about_two_bits_per_point() {
        let mut w = ChunkWriter::new(Kind::Float);
        for i in 0..1000 {
            w.push(&Point { t: 1_700_000_000_000 + i * 1000, value: Stored::Float(20.5), quality: 0 });
        }
        // time: one bit (dod 0); quality: one bit; value: one bit.
        assert!(w.bytes().len() < HEADER + 1000 * 3 / 8 + 16, "{}", w.bytes().len());
    }

    /// A value that swings between two levels: each XOR with the last value has the same
    /// meaningful bits, written in the window of the one before (no new window each time).
    #[test]
    fn a_value_swinging_between_two_levels_reuses_its_window() {
        let mut w = ChunkWriter::new(Kind::Float);
        for i in 0..1000 {
            let v = if i % 2 == 0 { 100.0 } else { 100.5 };
            w.push(&Point { t: 1_700_000_000_000 + i * 1000, value: Stored::Float(v), quality: 0 });
        }
        let n = w.bytes().len();
        // time and quality one bit each; the value: two control bits and the window's bits
        // (7 for 100.0 ^ 100.5), no 11 bits of window each time.
        assert!(n < HEADER + 1000 * 11 / 8 + 16, "{n}");
    }

    /// A text that repeats takes one bit per point, not its bytes again.
    #[test]
    fn a_repeated_text_takes_one_bit_per_point() {
        let mut w = ChunkWriter::new(Kind::Text);
        for i in 0..1000 {
            w.push(&Point {
                t: 1_700_000_000_000 + i * 1000,
                value: Stored::Text("running".into()),
                quality: 0,
            });
        }
        assert!(w.bytes().len() < HEADER + 1000 * 3 / 8 + 32, "{}", w.bytes().len());
        roundtrip(&decode(&w.bytes()).unwrap());
    }

    /// Regression (the adversarial walk): a text longer than a point keeps was cut in the
    /// middle of a character (read back with a replacement character); it keeps the
    /// characters that fit whole.
    #[test]
    fn a_text_longer_than_a_point_keeps_is_cut_where_a_character_ends() {
        // "é" is two bytes: 40,000 of them are 80,000 bytes.
        let long = "é".repeat(40_000);
        let mut w = ChunkWriter::new(Kind::Text);
        w.push(&Point { t: 0, value: Stored::Text(long.clone()), quality: 0 });
        let got = decode(&w.bytes()).unwrap();
        let Stored::Text(kept) = &got[0].value else { panic!("{:?}", got[0].value) };
        assert_eq!(kept.len(), MAX_TEXT_BYTES - 1, "32,767 whole characters");
        assert!(long.starts_with(kept.as_str()) && !kept.contains('\u{fffd}'));
    }

    /// Regression (the adversarial walk): a chunk whose header claims four billion points
    /// (made in a database by hand) decoded into gigabytes; it is refused as corrupt.
    #[test]
    fn a_chunk_claiming_more_points_than_any_holds_is_corrupt() {
        let mut w = ChunkWriter::new(Kind::Float);
        w.push(&Point { t: 0, value: Stored::Float(1.0), quality: 0 });
        let mut bytes = w.bytes();
        bytes[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        bytes.extend(std::iter::repeat_n(0u8, 1 << 20));
        assert!(decode(&bytes).is_err());
        bytes[1..5].copy_from_slice(&MAX_COUNT.to_le_bytes());
        assert!(decode(&bytes).is_ok_and(|p| p.len() == MAX_COUNT as usize));
    }
}
