//! The plan step of a raid4/5/6 stripe write (md's handle_stripe: analyse -> plan ->
//! execute). Pure: no IO, no locks; `raid5` analyses a stripe into a [`Summary`], asks
//! [`plan`] what to read and how to compute parity, and executes that.

use uraid_core::geometry::StripeList;

/// Data block indices of a stripe, inline up to 16 (no allocation per request).
pub type Blocks = StripeList<usize>;

/// How the write touches one data block of the stripe, over the rows [lo, hi) it spans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cover {
    /// Not written.
    None,
    /// Written over part of [lo, hi): the rest must come from the member.
    Partial,
    /// Written over all of [lo, hi).
    Full,
}

/// What analysis found out about one stripe write.
#[derive(Clone, Debug)]
pub struct Summary {
    /// Per data block (logical order).
    pub cover: StripeList<Cover>,
    /// Data blocks that cannot be read (missing, faulty, recovering above the cursor, or
    /// excluded after a read error).
    pub lost_data: Blocks,
    /// Parity blocks (P, and Q for raid6) that cannot be read.
    pub lost_parity: usize,
    /// 1 for raid4/5, 2 for raid6.
    pub parity_disks: usize,
    /// The journal logs whole pages and a piece is not page-aligned: parity must come from
    /// whole blocks, so read-modify-write is out.
    pub sub_page_journal: bool,
    /// md's rmw_level: 0 never read-modify-write, 1 when it reads fewer blocks, 2 also when
    /// it reads as many.
    pub rmw_level: u8,
}

/// How to compute the stripe's new parity, and which blocks to read for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Every data block is rewritten: parity from the new data alone, no reads.
    Full,
    /// Read-modify-write: read the old data of `read_data` (the written blocks) and the
    /// parity, fold old ^ new into it.
    Rmw { read_data: Blocks },
    /// Reconstruct-write: read `read_data` (what the write leaves), rebuild the lost blocks
    /// first when `reconstruct` (then every readable block is read), compute parity afresh.
    Rcw {
        read_data: Blocks,
        reconstruct: bool,
    },
    /// More blocks lost than the level tolerates.
    Unrecoverable,
}

impl Plan {
    /// Member blocks this plan reads (md's rmw/rcw counts).
    #[cfg(test)]
    pub fn reads(&self, s: &Summary) -> usize {
        match self {
            Plan::Full | Plan::Unrecoverable => 0,
            Plan::Rmw { read_data } => read_data.len() + s.parity_disks,
            Plan::Rcw {
                reconstruct: true, ..
            } => s.cover.len() - s.lost_data.len() + s.parity_disks - s.lost_parity,
            Plan::Rcw { read_data, .. } => read_data.len(),
        }
    }
}

/// Choose how to write the stripe, as md does: no reads for a full stripe; otherwise count
/// the blocks read-modify-write and reconstruct-write would read and take the smaller (by
/// rmw_level); a degraded stripe (or one whose parity is lost) reconstructs.
pub fn plan(s: &Summary) -> Plan {
    if s.lost_data.len() + s.lost_parity > s.parity_disks {
        return Plan::Unrecoverable;
    }
    if s.cover.iter().all(|c| *c == Cover::Full) {
        return Plan::Full;
    }
    let touched: Blocks = (0..s.cover.len())
        .filter(|&i| s.cover[i] != Cover::None)
        .collect();
    let uncovered: Blocks = (0..s.cover.len())
        .filter(|&i| s.cover[i] != Cover::Full)
        .collect();
    let healthy = s.lost_data.is_empty() && s.lost_parity == 0;
    let rmw_reads = touched.len() + s.parity_disks;
    let rcw_reads = uncovered.len();
    let rmw = healthy
        && !s.sub_page_journal
        && match s.rmw_level {
            0 => false,
            1 => rmw_reads < rcw_reads,
            _ => rmw_reads <= rcw_reads,
        };
    if rmw {
        return Plan::Rmw { read_data: touched };
    }
    // A lost block that the write does not fully replace must be rebuilt first.
    let reconstruct = uncovered.iter().any(|i| s.lost_data.contains(i));
    Plan::Rcw {
        read_data: uncovered,
        reconstruct,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smallvec::smallvec;
    use Cover::{Full as F, None as N, Partial as P};

    fn sum(cover: &[Cover], parity_disks: usize, rmw_level: u8) -> Summary {
        Summary {
            cover: cover.into(),
            lost_data: Blocks::new(),
            lost_parity: 0,
            parity_disks,
            sub_page_journal: false,
            rmw_level,
        }
    }

    fn kind(p: &Plan) -> &'static str {
        match p {
            Plan::Full => "full",
            Plan::Rmw { .. } => "rmw",
            Plan::Rcw { .. } => "rcw",
            Plan::Unrecoverable => "fail",
        }
    }

    #[test]
    fn raid5_counts_choose_by_rmw_level() {
        // 4 disks (3 data), one block written: rmw reads 2 (data + P), rcw reads 2.
        let one_of_3 = [F, N, N];
        let k = |lvl| kind(&plan(&sum(&one_of_3, 1, lvl)));
        assert_eq!((k(0), k(1), k(2)), ("rcw", "rcw", "rmw"));
        // 5 disks (4 data), one block: rmw 2 < rcw 3.
        let one_of_4 = [N, F, N, N];
        let k = |lvl| kind(&plan(&sum(&one_of_4, 1, lvl)));
        assert_eq!((k(0), k(1), k(2)), ("rcw", "rmw", "rmw"));
        let p = plan(&sum(&one_of_4, 1, 1));
        assert_eq!(
            p,
            Plan::Rmw {
                read_data: smallvec![1]
            }
        );
        assert_eq!(p.reads(&sum(&one_of_4, 1, 1)), 2);
        // 5 disks, three of four written: rmw 4 > rcw 1.
        let three = [F, F, F, N];
        let p = plan(&sum(&three, 1, 2));
        assert_eq!(
            p,
            Plan::Rcw {
                read_data: smallvec![3],
                reconstruct: false
            }
        );
        assert_eq!(p.reads(&sum(&three, 1, 2)), 1);
    }

    #[test]
    fn raid6_counts_include_both_parities() {
        // 6 disks (4 data), one block: rmw reads 1 + P + Q = 3, rcw reads 3: a tie.
        let one = [F, N, N, N];
        let k = |lvl| kind(&plan(&sum(&one, 2, lvl)));
        assert_eq!((k(0), k(1), k(2)), ("rcw", "rcw", "rmw"));
        // 8 disks (6 data), one block: rmw 3 < rcw 5.
        let one_of_6 = [N, N, F, N, N, N];
        assert_eq!(kind(&plan(&sum(&one_of_6, 2, 1))), "rmw");
        assert_eq!(kind(&plan(&sum(&one_of_6, 2, 0))), "rcw");
        // A partial block counts for both: rcw must read it too.
        let partial = [P, F, N, N];
        let p = plan(&sum(&partial, 2, 1));
        assert_eq!(
            p,
            Plan::Rcw {
                read_data: smallvec![0, 2, 3],
                reconstruct: false
            }
        );
    }

    #[test]
    fn a_full_stripe_reads_nothing_even_degraded() {
        let mut s = sum(&[F, F, F], 1, 1);
        assert_eq!(plan(&s), Plan::Full);
        s.lost_data = smallvec![1];
        assert_eq!(plan(&s), Plan::Full);
        assert_eq!(plan(&s).reads(&s), 0);
    }

    #[test]
    fn degraded_stripes_reconstruct_and_never_rmw() {
        // raid5, 5 disks, one block written, another data block lost: rmw would be cheaper
        // but needs every old block it folds; md reconstructs.
        let mut s = sum(&[F, N, N, N], 1, 2);
        s.lost_data = smallvec![2];
        let p = plan(&s);
        assert_eq!(
            p,
            Plan::Rcw {
                read_data: smallvec![1, 2, 3],
                reconstruct: true
            }
        );
        // Everything readable is read to rebuild block 2: data 0, 1, 3 and P.
        assert_eq!(p.reads(&s), 4);
        // The written block itself lost: nothing to rebuild, read the others.
        s.lost_data = smallvec![0];
        assert_eq!(
            plan(&s),
            Plan::Rcw {
                read_data: smallvec![1, 2, 3],
                reconstruct: false
            }
        );
        // Parity lost: no rmw either.
        s.lost_data = smallvec![];
        s.lost_parity = 1;
        assert_eq!(kind(&plan(&s)), "rcw");
        // raid6 with two data blocks lost, one of them untouched.
        let mut s6 = sum(&[F, N, N, N], 2, 1);
        s6.lost_data = smallvec![0, 3];
        assert_eq!(
            plan(&s6),
            Plan::Rcw {
                read_data: smallvec![1, 2, 3],
                reconstruct: true
            }
        );
    }

    #[test]
    fn beyond_the_tolerance_is_unrecoverable() {
        let mut s = sum(&[F, N, N], 1, 1);
        s.lost_data = smallvec![1];
        s.lost_parity = 1;
        assert_eq!(plan(&s), Plan::Unrecoverable);
        let mut s6 = sum(&[F, N, N, N], 2, 1);
        s6.lost_data = smallvec![1, 2, 3];
        assert_eq!(plan(&s6), Plan::Unrecoverable);
    }

    #[test]
    fn a_sub_page_journal_write_reconstructs() {
        let mut s = sum(&[N, F, N, N], 1, 2);
        s.sub_page_journal = true;
        assert_eq!(kind(&plan(&s)), "rcw");
    }
}
