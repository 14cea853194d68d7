//! Coalescing: the fewest reads per table that cover a set of points, within the
//! device's `max_registers_per_read` and `max_gap`.
//!
//! For coil and discrete tables a read covers up to 16 × `max_registers_per_read` bits
//! (at most 2000, the protocol's limit) and may skip 16 × `max_gap` bits: the same
//! number of bytes on the wire as the register limits.

use crate::registry::{ModbusPoint, RegisterTable};

/// One read request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub table: RegisterTable,
    pub start: u16,
    pub count: u16,
    /// Indices (into the planned slice) of the points this read covers.
    pub members: Vec<usize>,
}

/// The limits of one table of one device.
fn limits(table: RegisterTable, max_regs: u16, max_gap: u16) -> (u32, u32) {
    if table.is_bits() {
        ((u32::from(max_regs) * 16).min(2000), u32::from(max_gap) * 16)
    } else {
        (u32::from(max_regs), u32::from(max_gap))
    }
}

/// Plans reads for `points`. A point larger than the limit gets a read of its own (the
/// registry refuses such points, so this only guards against misuse).
pub fn plan(points: &[&ModbusPoint], max_regs: u16, max_gap: u16) -> Vec<Block> {
    let mut order: Vec<usize> = (0..points.len()).collect();
    order.sort_by_key(|&i| (points[i].table, points[i].address, points[i].count));
    let mut blocks: Vec<Block> = Vec::new();
    let mut cur: Option<(Block, u32)> = None; // the block and its exclusive end
    for i in order {
        let p = points[i];
        let (start, end) = (u32::from(p.address), u32::from(p.address) + u32::from(p.count));
        let (limit, gap) = limits(p.table, max_regs, max_gap);
        if let Some((b, b_end)) = &mut cur {
            let new_end = end.max(*b_end);
            let fits = b.table == p.table && start <= *b_end + gap && new_end - u32::from(b.start) <= limit;
            if fits {
                *b_end = new_end;
                b.count = (new_end - u32::from(b.start)) as u16;
                b.members.push(i);
                continue;
            }
        }
        if let Some((b, _)) = cur.take() {
            blocks.push(b);
        }
        cur = Some((Block { table: p.table, start: p.address, count: p.count, members: vec![i] }, end));
    }
    if let Some((b, _)) = cur {
        blocks.push(b);
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{DataType, WordOrder};
    use proptest::prelude::*;

    fn pt(table: RegisterTable, address: u16, count: u16) -> ModbusPoint {
        ModbusPoint {
            table,
            address,
            data_type: if table.is_bits() { DataType::Bool } else { DataType::U16 },
            word_order: WordOrder::ABCD,
            bit: None,
            count,
            scale: 1.0,
            offset: 0.0,
        }
    }

    #[test]
    fn adjacent_and_near_points_share_a_read() {
        use RegisterTable::*;
        let pts =
            [pt(Holding, 0, 2), pt(Holding, 2, 2), pt(Holding, 10, 1), pt(Holding, 30, 2), pt(Input, 0, 2)];
        let refs: Vec<&ModbusPoint> = pts.iter().collect();
        let blocks = plan(&refs, 125, 8);
        // Tables in declaration order (input before holding); 0..4 and 10 share a read.
        assert_eq!(
            blocks,
            vec![
                Block { table: Input, start: 0, count: 2, members: vec![4] },
                Block { table: Holding, start: 0, count: 11, members: vec![0, 1, 2] },
                Block { table: Holding, start: 30, count: 2, members: vec![3] },
            ]
        );
        // With max_gap 0 the register at 10 needs its own read.
        assert_eq!(plan(&refs, 125, 0).len(), 4);
        // With 4 registers per read, 0..4 fits but 0..11 does not.
        assert_eq!(plan(&refs, 4, 8).iter().filter(|b| b.table == Holding).count(), 3);
    }

    #[test]
    fn overlapping_points_are_read_once() {
        let a = pt(RegisterTable::Holding, 20, 1);
        let b = pt(RegisterTable::Holding, 20, 1);
        let blocks = plan(&[&a, &b], 125, 0);
        assert_eq!(blocks.len(), 1);
        assert_eq!((blocks[0].start, blocks[0].count), (20, 1));
    }

    #[test]
    fn coils_use_bit_limits() {
        let a = pt(RegisterTable::Coil, 0, 1);
        let b = pt(RegisterTable::Coil, 100, 1);
        // max_gap 8 registers = 128 bits, so coils 0 and 100 share a read.
        assert_eq!(plan(&[&a, &b], 125, 8).len(), 1);
        assert_eq!(plan(&[&a, &b], 125, 4).len(), 2);
    }

    #[test]
    fn a_read_is_as_long_as_max_registers_counted_from_its_start() {
        use RegisterTable::*;
        // A block starting at 100: 100..104 is 4 registers, so it fits a 4-register read;
        // 100..105 is 5 and does not.
        let (a, b, c) = (pt(Holding, 100, 2), pt(Holding, 102, 2), pt(Holding, 103, 2));
        assert_eq!(
            plan(&[&a, &b], 4, 0),
            vec![Block { table: Holding, start: 100, count: 4, members: vec![0, 1] }]
        );
        assert_eq!(
            plan(&[&a, &c], 4, 1),
            vec![
                Block { table: Holding, start: 100, count: 2, members: vec![0] },
                Block { table: Holding, start: 103, count: 2, members: vec![1] },
            ]
        );
    }

    #[test]
    fn a_bit_read_is_sixteen_bits_per_register_up_to_2000() {
        use RegisterTable::*;
        // 4 registers = 64 bits: coils 0 and 63 share a read, coils 0 and 64 do not.
        let (c0, c63, c64) = (pt(Coil, 0, 1), pt(Coil, 63, 1), pt(Coil, 64, 1));
        assert_eq!(
            plan(&[&c0, &c63], 4, 4),
            vec![Block { table: Coil, start: 0, count: 64, members: vec![0, 1] }]
        );
        assert_eq!(plan(&[&c0, &c64], 4, 4).len(), 2);
        // 125 registers would be 2000 bits, 126 would be 2016 but the protocol caps a read
        // at 2000: discrete inputs 0 and 1999 share a read, 0 and 2000 do not.
        let (d0, d1999, d2000) = (pt(Discrete, 0, 1), pt(Discrete, 1999, 1), pt(Discrete, 2000, 1));
        assert_eq!(
            plan(&[&d0, &d1999], 126, 125),
            vec![Block { table: Discrete, start: 0, count: 2000, members: vec![0, 1] }]
        );
        assert_eq!(plan(&[&d0, &d2000], 126, 125).len(), 2);
    }

    /// The limits as the module documentation states them, written out here rather than
    /// taken from `limits`: (longest read, widest gap), in registers or bits.
    fn documented_limits(table: RegisterTable, max_regs: u16, max_gap: u16) -> (u32, u32) {
        match table {
            RegisterTable::Coil | RegisterTable::Discrete => {
                ((16 * u32::from(max_regs)).min(2000), 16 * u32::from(max_gap))
            }
            RegisterTable::Holding | RegisterTable::Input => (u32::from(max_regs), u32::from(max_gap)),
        }
    }

    /// Fewest blocks by dynamic programming over the sorted points (blocks are runs).
    fn optimum(points: &[ModbusPoint], max_regs: u16, max_gap: u16) -> usize {
        let mut ps: Vec<&ModbusPoint> = points.iter().collect();
        ps.sort_by_key(|p| (p.table, p.address, p.count));
        let n = ps.len();
        let mut best = vec![usize::MAX; n + 1];
        best[0] = 0;
        for i in 0..n {
            if best[i] == usize::MAX {
                continue;
            }
            let (limit, gap) = documented_limits(ps[i].table, max_regs, max_gap);
            let start = u32::from(ps[i].address);
            let mut end = start + u32::from(ps[i].count);
            for j in i..n {
                let p = ps[j];
                let (s, e) = (u32::from(p.address), u32::from(p.address) + u32::from(p.count));
                if p.table != ps[i].table || (j > i && s > end + gap) {
                    break;
                }
                end = end.max(e);
                if end - start > limit && j > i {
                    break;
                }
                best[j + 1] = best[j + 1].min(best[i] + 1);
            }
        }
        best[n]
    }

    /// One of the four tables: registers hold points of 1, 2 or 4 registers at 0-199,
    /// bit tables single bits at 0-5999 (so the 2000-bit cap of a read is reached).
    fn point() -> impl Strategy<Value = ModbusPoint> {
        prop_oneof![
            (0u16..200, prop::sample::select(vec![1u16, 2, 4])).prop_map(|(a, c)| pt(
                RegisterTable::Holding,
                a,
                c
            )),
            (0u16..200, prop::sample::select(vec![1u16, 2, 4])).prop_map(|(a, c)| pt(
                RegisterTable::Input,
                a,
                c
            )),
            (0u16..6000).prop_map(|a| pt(RegisterTable::Coil, a, 1)),
            (0u16..6000).prop_map(|a| pt(RegisterTable::Discrete, a, 1)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]
        #[test]
        fn plans_cover_every_point_within_limits_with_the_fewest_reads(
            points in prop::collection::vec(point(), 1..40),
            max_regs in 4u16..200,
            max_gap in 0u16..10,
        ) {
            let refs: Vec<&ModbusPoint> = points.iter().collect();
            let blocks = plan(&refs, max_regs, max_gap);
            let mut seen = vec![0; points.len()];
            for b in &blocks {
                let (limit, _) = documented_limits(b.table, max_regs, max_gap);
                prop_assert!(u32::from(b.count) <= limit, "{:?} over {}", b, limit);
                for &m in &b.members {
                    let p = &points[m];
                    seen[m] += 1;
                    prop_assert_eq!(p.table, b.table);
                    prop_assert!(p.address >= b.start && p.address + p.count <= b.start + b.count);
                }
            }
            prop_assert!(seen.iter().all(|&n| n == 1), "every point in exactly one read");
            prop_assert_eq!(blocks.len(), optimum(&points, max_regs, max_gap));
        }
    }
}
