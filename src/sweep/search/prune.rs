//! Successive halving's decision: which candidates stop after their first window, because
//! their throughput interval lies wholly below the leader's, measured on GPUs of the same
//! hosts; and how long that first window and its bins are. Pure.

use std::time::Duration;

use crate::sweep::assign::Slot;
use crate::sweep::search::{Screen, Verdict};
use crate::sweep::space::Candidate;
use crate::sweep::stats::Estimate;

/// A candidate's first-window figure as the decision sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Contender {
    pub candidate: usize,
    /// The hosts its GPUs are on, sorted: candidates are only compared like for like.
    pub hosts: Vec<String>,
    pub estimate: Estimate,
}

/// The contender a candidate stops for: `candidate` is clearly ahead, with `estimate`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Leader {
    pub candidate: usize,
    pub estimate: Estimate,
}

/// The like-for-like key of a candidate's GPUs: the hosts they are on.
pub fn hosts(slots: &[Slot]) -> Vec<String> {
    let mut h: Vec<String> = slots.iter().map(|s| s.host.clone()).collect();
    h.sort();
    h.dedup();
    h
}

/// Successive halving over one call's `screens`, numbered by the strategy (`numbers`, in the
/// same order): those with a number and an estimate are judged together against the `board`,
/// then join it; one clearly behind its leader is pruned by it (`candidate` names the leader).
pub fn judge(
    board: &mut Vec<Contender>,
    screens: &[Screen],
    numbers: &[Option<usize>],
    candidate: impl Fn(usize) -> Candidate,
) -> Vec<Verdict> {
    let contenders: Vec<Option<Contender>> = screens
        .iter()
        .zip(numbers)
        .map(|(s, n)| {
            Some(Contender {
                candidate: (*n)?,
                hosts: hosts(&s.gpus),
                estimate: s.estimate?,
            })
        })
        .collect();
    let judged: Vec<Contender> = contenders.iter().flatten().cloned().collect();
    let mut decided = decide(board, &judged).into_iter();
    let verdicts = contenders
        .iter()
        .map(
            |c| match c.as_ref().and_then(|_| decided.next().flatten()) {
                Some(l) => Verdict::Prune {
                    leader: candidate(l.candidate),
                    estimate: l.estimate,
                },
                None => Verdict::Continue,
            },
        )
        .collect();
    board.extend(judged);
    verdicts
}

/// For each of `screened` (just through their first window), given the `board` of
/// candidates screened before (on any earlier round, or an earlier run of a resumed sweep).
/// The leader is the contender with the highest mean on the same hosts, among the board and
/// the screened; a candidate stops only when its whole interval lies below the leader's, so
/// two candidates whose intervals overlap both go on, and the best one (whose interval, at 95%,
/// holds its true rate) is never stopped by one it is better than.
/// `None`: it runs the full window.
pub fn decide(board: &[Contender], screened: &[Contender]) -> Vec<Option<Leader>> {
    screened
        .iter()
        .map(|c| {
            let leader = board
                .iter()
                .chain(screened)
                .filter(|o| o.candidate != c.candidate && o.hosts == c.hosts)
                .max_by(|a, b| a.estimate.mean.total_cmp(&b.estimate.mean));
            leader
                .filter(|l| c.estimate.clearly_below(&l.estimate))
                .map(|l| Leader {
                    candidate: l.candidate,
                    estimate: l.estimate,
                })
        })
        .collect()
}

/// The first window of a trial of `duration`: a quarter of it.
pub fn first_window(duration: Duration) -> Duration {
    duration / 4
}

/// The width of the bins a window's throughput is sampled in: one second, or less for short
/// windows, so that a first window always holds at least 8 bins.
pub fn bin_width(duration: Duration) -> Duration {
    (duration / 32).min(Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(mean: f64, half: f64) -> Estimate {
        Estimate::around(mean, half)
    }

    fn c(candidate: usize, host: &str, est: Estimate) -> Contender {
        Contender {
            candidate,
            hosts: vec![host.to_string()],
            estimate: est,
        }
    }

    #[test]
    fn clear_losers_stop_and_a_close_race_goes_on() {
        let screened = [
            c(0, "a", e(107.0, 10.0)),
            c(1, "a", e(1180.0, 40.0)),
            c(2, "a", e(1150.0, 40.0)),
            c(3, "a", e(108.0, 12.0)),
        ];
        let v = decide(&[], &screened);
        let leader = Some(Leader {
            candidate: 1,
            estimate: e(1180.0, 40.0),
        });
        assert_eq!(v, vec![leader, None, None, leader]);
    }

    #[test]
    fn the_board_of_earlier_rounds_leads_and_the_leader_itself_goes_on() {
        let board = [c(7, "a", e(1250.0, 20.0))];
        let v = decide(
            &board,
            &[c(8, "a", e(1180.0, 30.0)), c(9, "a", e(1300.0, 60.0))],
        );
        assert_eq!(
            v[0],
            Some(Leader {
                candidate: 9,
                estimate: e(1300.0, 60.0)
            }),
            "the best mean leads, also from the same round"
        );
        assert_eq!(v[1], None);
        // Against the board alone: 1180 +- 30 lies below 1250 +- 20.
        let v = decide(&board, &[c(8, "a", e(1180.0, 30.0))]);
        assert!(matches!(v[0], Some(Leader { candidate: 7, .. })));
        // A lone candidate has no one to lose to.
        assert_eq!(decide(&[], &[c(0, "a", e(1.0, 0.1))]), vec![None]);
    }

    #[test]
    fn candidates_are_only_compared_on_the_same_hosts() {
        let v = decide(
            &[c(0, "fast-gpus", e(5000.0, 10.0))],
            &[c(1, "slow-gpus", e(100.0, 10.0))],
        );
        assert_eq!(v, vec![None]);
    }

    #[test]
    fn the_true_best_survives_whatever_the_draw_when_intervals_cover_it() {
        // Every interval holds its candidate's true rate (what a 95% interval does 95% of the
        // time); whatever the leader drew, the best candidate's interval reaches its true rate,
        // which no other interval lies wholly above.
        let truth = [1000.0, 1040.0, 700.0, 1030.0];
        for shift in [-0.9, -0.5, 0.0, 0.5, 0.9] {
            for half in [5.0, 30.0, 100.0] {
                let screened: Vec<Contender> = truth
                    .iter()
                    .enumerate()
                    .map(|(i, &t)| {
                        // Alternate the direction so that the best is drawn low when others
                        // are drawn high.
                        let s = if i == 1 { -shift } else { shift };
                        c(i, "a", e(t + s * half, half))
                    })
                    .collect();
                let v = decide(&[], &screened);
                assert_eq!(v[1], None, "shift {shift} half {half}");
            }
        }
    }

    #[test]
    fn windows_and_bins() {
        assert_eq!(
            first_window(Duration::from_secs(60)),
            Duration::from_secs(15)
        );
        assert_eq!(bin_width(Duration::from_secs(60)), Duration::from_secs(1));
        assert_eq!(
            bin_width(Duration::from_secs(4)),
            Duration::from_millis(125)
        );
        let d = Duration::from_secs(10);
        assert_eq!(first_window(d).as_nanos() / bin_width(d).as_nanos(), 8);
    }
}
