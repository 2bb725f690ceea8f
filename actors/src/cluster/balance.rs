//! Placement: how many partitions of each topic each broker should lead, as
//! a pure function of (eligible brokers, topics, current owners).
//!
//! Two caps hold in every answer: a broker leads at most
//! `ceil(total / brokers)` partitions of the class, and at most
//! `ceil(partitions(t) / brokers)` of each topic `t`. Among all placements
//! meeting both, the answer keeps the most partitions where they are — it
//! is a minimum-cost flow (cost 1 per partition that does not stay with its
//! current owner), so a partition moves only when a cap (or an owner gone)
//! forces it, directly or to make room for one that must move.
//!
//! **Why it settles.** Fed its own answer back (every partition held where
//! the answer put it), every cap already holds, keeping everything costs 0,
//! and the answer is the input: a fixed point after one pass. Between the
//! two phases of a move (vacated, not yet released) the vacated partitions
//! are units to place like any free one, at cost 1 wherever they go; the
//! previous answer is still a placement of cost exactly their number, so
//! no partition that stays is moved, and none returns to the owner it left:
//! had it fitted there, leaving it in place would have been one move
//! cheaper in the pass that moved it. (Property test
//! `balance_settles_with_both_caps_met` in `plan.rs`.)
//!
//! **How.** The flow network is source → topic (the units of the topic to
//! place) → broker (per-topic cap; the first `min(held, cap)` units cost 0,
//! the rest 1) → sink (per-broker cap). It starts from a minimum-cost flow
//! — every partition kept within the per-topic cap, the excess of a
//! broker over its total cap dropped from the topics it holds most of —
//! and adds one unit at a time along a shortest augmenting path
//! (successive shortest paths, which keeps the flow of minimum cost). Almost
//! every unit has a direct path of cost 1 (a broker with room for its topic
//! and in total), which is then a shortest one; only when none exists does a
//! Bellman-Ford search run (a chain of displacements). A feasible flow always
//! exists: dealing all partitions round-robin, topic after topic, meets both
//! caps.

/// One topic of a placement problem.
#[derive(Debug, Clone, Default)]
pub struct TopicLoad {
    /// Partitions of the topic, whoever holds them (the per-topic cap).
    pub partitions: usize,
    /// Per eligible broker (by index): how many partitions it holds now.
    pub held: Vec<usize>,
    /// Partitions held by no eligible broker that are to be placed (free,
    /// or vacated and not yet released).
    pub unplaced: usize,
}

/// Caps of a class: `ceil(total / brokers)` and per topic
/// `ceil(partitions / brokers)`.
fn caps(topics: &[TopicLoad], brokers: usize, total: usize) -> (usize, Vec<usize>) {
    let cap = total.div_ceil(brokers);
    let per = topics
        .iter()
        .map(|t| t.partitions.div_ceil(brokers))
        .collect();
    (cap, per)
}

/// The placement: `result[t][b]` partitions of topic `t` on broker `b`.
/// `total` counts every partition of the class (also those held by brokers
/// that are not eligible, which stay where they are and are not in
/// `topics`). Every unit held or unplaced is placed; the answer keeps as
/// many held partitions where they are as any placement meeting both caps
/// can.
pub fn place(topics: &[TopicLoad], brokers: usize, total: usize) -> Vec<Vec<usize>> {
    let mut f: Vec<Vec<usize>> = topics.iter().map(|_| vec![0; brokers]).collect();
    if brokers == 0 {
        return f;
    }
    let (cap, cap_t) = caps(topics, brokers, total);
    // Cost-0 capacity of (t, b): what b holds of t, up to the topic cap.
    let keep: Vec<Vec<usize>> = topics
        .iter()
        .zip(&cap_t)
        .map(|(t, &c)| (0..brokers).map(|b| held(t, b).min(c)).collect())
        .collect();
    let mut load = vec![0usize; brokers];
    // The starting flow: keep everything within the topic cap; a broker
    // over its total cap drops from the topics it holds most of.
    for b in 0..brokers {
        let mut heap: std::collections::BinaryHeap<(usize, usize)> = (0..topics.len())
            .filter(|&t| keep[t][b] > 0)
            .map(|t| (keep[t][b], t))
            .collect();
        let mut sum: usize = keep.iter().map(|k| k[b]).sum();
        let mut kept: Vec<usize> = keep.iter().map(|k| k[b]).collect();
        while sum > cap {
            let Some((n, t)) = heap.pop() else { break };
            kept[t] = n - 1;
            sum -= 1;
            if n > 1 {
                heap.push((n - 1, t));
            }
        }
        for (t, k) in kept.into_iter().enumerate() {
            f[t][b] = k;
        }
        load[b] = sum;
    }
    let mut rem: Vec<usize> = topics
        .iter()
        .enumerate()
        .map(|(t, tl)| {
            let units = (0..brokers).map(|b| held(tl, b)).sum::<usize>() + tl.unplaced;
            units - f[t].iter().sum::<usize>()
        })
        .collect();
    let net = Net {
        cap,
        cap_t: &cap_t,
        keep: &keep,
    };
    // Bounded: every round places one unit or ends.
    let units: usize = rem.iter().sum();
    for _ in 0..=units {
        if !direct(&net, &mut f, &mut load, &mut rem) && !net.augment(&mut f, &mut load, &mut rem) {
            break;
        }
    }
    f
}

fn held(t: &TopicLoad, b: usize) -> usize {
    t.held.get(b).copied().unwrap_or(0)
}

/// Place every unit that has a direct path (cost 1: a broker with room
/// for its topic and in total — the least loaded). Returns whether any
/// unit was placed.
fn direct(net: &Net, f: &mut [Vec<usize>], load: &mut [usize], rem: &mut [usize]) -> bool {
    let mut any = false;
    for t in 0..rem.len() {
        while rem[t] > 0 {
            let best = (0..load.len())
                .filter(|&b| f[t][b] < net.cap_t[t] && load[b] < net.cap)
                .min_by_key(|&b| (load[b], f[t][b], b));
            let Some(b) = best else { break };
            f[t][b] += 1;
            load[b] += 1;
            rem[t] -= 1;
            any = true;
        }
    }
    any
}

/// The residual network's fixed parts.
struct Net<'a> {
    cap: usize,
    cap_t: &'a [usize],
    keep: &'a [Vec<usize>],
}

impl Net<'_> {
    /// Cost of one more unit of topic t on broker b, if it fits the topic cap.
    fn forward(&self, f: &[Vec<usize>], t: usize, b: usize) -> Option<i64> {
        let n = f[t][b];
        (n < self.cap_t[t]).then_some(if n < self.keep[t][b] { 0 } else { 1 })
    }

    /// Cost of one unit of topic t fewer on broker b, if it has one.
    fn backward(&self, f: &[Vec<usize>], t: usize, b: usize) -> Option<i64> {
        let n = f[t][b];
        (n > 0).then_some(if n > self.keep[t][b] { -1 } else { 0 })
    }

    /// One unit along a shortest augmenting path (Bellman-Ford: the
    /// residual network has negative edges but, the flow being of minimum
    /// cost, no negative cycle). Returns whether a unit was placed.
    fn augment(&self, f: &mut [Vec<usize>], load: &mut [usize], rem: &mut [usize]) -> bool {
        let (nt, nb) = (rem.len(), load.len());
        // Nodes: topics 0..nt, brokers nt..nt+nb. Source and sink implicit.
        const INF: i64 = i64::MAX / 4;
        let mut dist = vec![INF; nt + nb];
        let mut parent = vec![usize::MAX; nt + nb];
        for t in 0..nt {
            if rem[t] > 0 {
                dist[t] = 0;
            }
        }
        // At most |V| rounds without a negative cycle; bounded regardless.
        for _ in 0..(nt + nb) {
            let mut changed = false;
            for t in 0..nt {
                if dist[t] == INF {
                    continue;
                }
                for b in 0..nb {
                    if let Some(c) = self.forward(f, t, b) {
                        if dist[t] + c < dist[nt + b] {
                            dist[nt + b] = dist[t] + c;
                            parent[nt + b] = t;
                            changed = true;
                        }
                    }
                }
            }
            for b in 0..nb {
                if dist[nt + b] == INF {
                    continue;
                }
                for t in 0..nt {
                    if let Some(c) = self.backward(f, t, b) {
                        if dist[nt + b] + c < dist[t] {
                            dist[t] = dist[nt + b] + c;
                            parent[t] = nt + b;
                            changed = true;
                        }
                    }
                }
            }
            if !changed {
                break;
            }
        }
        let Some(end) = (0..nb)
            .filter(|&b| load[b] < self.cap && dist[nt + b] < INF)
            .min_by_key(|&b| (dist[nt + b], load[b], b))
        else {
            return false;
        };
        load[end] += 1;
        let mut node = nt + end;
        // A shortest path visits each node once.
        for _ in 0..=(nt + nb) {
            let b = node - nt;
            let t = parent[node];
            f[t][b] += 1;
            match parent[t] {
                usize::MAX => {
                    rem[t] -= 1;
                    return true;
                }
                p => {
                    f[t][p - nt] -= 1;
                    node = p;
                }
            }
        }
        debug_assert!(false, "augmenting path longer than the network");
        true
    }
}
