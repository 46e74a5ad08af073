//! How a job's ranks lie: the parallel dimensions its process groups make, and where each
//! rank and each group lies once the data-parallel dimension has another size.
//!
//! The subgroups a job records (`## process_group:init ##`, each rank its own) fall into
//! families: the groups of one description, size and stride, which tile the world (a device
//! mesh's `mesh_tp` groups, Megatron's tensor-parallel groups). Each family is a run of
//! adjacent dimensions of a mixed-radix numbering of the ranks, innermost (stride 1) first:
//! `rank = sum(coord[d] * stride[d])`, `stride[d]` the product of the sizes below `d`. Ranks no
//! family's stride explains make dimensions of their own. One family is the data-parallel one;
//! at a world `N` its dimension has size `N / (W / D)` and every other keeps its size, so that a
//! rank's coordinates in the other dimensions, and the groups they make, are those of the
//! capture. A new rank is made from the captured rank at the same coordinates, its
//! data-parallel coordinate the capture's last where the capture had fewer.

use super::{PgInit, WorldError};
use std::collections::HashMap;
use std::ops::Range;

/// A family's description, group size and stride.
type FamilyKey = (String, usize, usize);

/// One family of groups: alike in description, size and stride, tiling the world.
#[derive(Clone, Debug)]
struct Family {
    desc: String,
    /// The dimensions it spans (adjacent); empty for groups of one rank.
    dims: Range<usize>,
    /// One of its groups' names, to name it where the description says nothing.
    example: String,
}

/// Where a rank's group lies at some world size.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Place {
    /// The group's `pg_name` at that world size.
    pub name: String,
    /// Its size.
    pub size: usize,
    /// The rank's place in it (group rank).
    pub me: usize,
    /// Its first global rank.
    pub start: usize,
    /// The distance between its ranks: they are `start + k * stride`.
    pub stride: usize,
}

/// A family's groups at the capture's world size and at another (for the report).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GroupsScaled {
    /// The groups' description (`pg_desc`), or the world's.
    pub desc: String,
    /// Whether they are the data-parallel groups (or the world).
    pub data_parallel: bool,
    /// How many groups the capture had.
    pub groups_before: usize,
    /// Their size in the capture.
    pub size_before: usize,
    /// How many at the new world size.
    pub groups_after: usize,
    /// Their size there.
    pub size_after: usize,
}

/// The ranks' layout (see the module text).
#[derive(Clone, Debug)]
pub(super) struct Layout {
    world: usize,
    /// Dimension sizes in the capture, innermost first.
    dims: Vec<usize>,
    /// The data-parallel dimension.
    dp: usize,
    families: Vec<Family>,
    /// A group's name: its family.
    by_name: HashMap<String, usize>,
    /// (family, captured rank): the name of that rank's group in the family.
    names: HashMap<(usize, usize), String>,
    /// The names of the groups of every rank: the world, and any other group of all ranks
    /// (PyTorch records a group of every rank with no ranks listed, as the world).
    world_names: Vec<String>,
    /// Names of groups the capture did not have start here (past every numeric name).
    fresh: u64,
}

impl Layout {
    /// The layout of a `world`-rank job whose ranks recorded `records`; `dp` names the
    /// data-parallel groups (a description, or one of their names), else they are the
    /// family whose description says data parallel (`mesh_dp`, `DATA_PARALLEL_GROUP`), or the
    /// world where no group of more than one rank splits it.
    pub fn new(
        records: &[Vec<PgInit>],
        world: usize,
        dp: Option<&str>,
    ) -> Result<Layout, WorldError> {
        let mut world_names: Vec<String> = Vec::new();
        let mut fresh = 0u64;
        // Every group once, by name (each rank records the groups it is in).
        let mut groups: Vec<&PgInit> = Vec::new();
        for g in records.iter().flatten() {
            if let Ok(k) = g.pg_name.parse::<u64>() {
                fresh = fresh.max(k + 1);
            }
            if is_world(g, world) {
                if !world_names.contains(&g.pg_name) {
                    world_names.push(g.pg_name.clone());
                }
                continue;
            }
            if !groups.iter().any(|x| x.pg_name == g.pg_name) {
                groups.push(g);
            }
        }
        if world_names.is_empty() {
            world_names.push("0".into());
        }
        // Families: description, size and stride.
        let mut keyed: Vec<(FamilyKey, Vec<&PgInit>)> = Vec::new();
        for g in groups {
            let bad = |why: String| WorldError::Group {
                name: g.pg_name.clone(),
                ranks: g.ranks.clone(),
                world,
                why,
            };
            let ranks: Vec<usize> = g
                .ranks
                .iter()
                .map(|&r| usize::try_from(r).ok().filter(|&r| r < world))
                .collect::<Option<_>>()
                .ok_or_else(|| bad(format!("it names a rank outside the {world} captured")))?;
            // A group of one rank: stride 0, as PyTorch's own records have it.
            let stride = if ranks.len() > 1 {
                ranks[1].saturating_sub(ranks[0])
            } else {
                0
            };
            let progression = (stride > 0 || ranks.len() == 1)
                && ranks
                    .iter()
                    .enumerate()
                    .all(|(k, &r)| r == ranks[0] + k * stride);
            if !progression {
                return Err(bad(
                    "its ranks are not evenly spaced in rank order, so it is not one dimension \
                     of a rank grid"
                        .into(),
                ));
            }
            let key = (g.pg_desc.clone(), ranks.len(), stride);
            match keyed.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(g),
                None => keyed.push((key, vec![g])),
            }
        }
        // The grid's dimensions, innermost first: between consecutive boundaries, a boundary
        // being where a family's groups start repeating (its stride) or end (stride x size).
        let mut bounds: Vec<usize> = vec![1, world];
        for ((_, size, stride), members) in &keyed {
            if members.len() * size != world {
                let first = members[0];
                return Err(WorldError::Group {
                    name: first.pg_name.clone(),
                    ranks: first.ranks.clone(),
                    world,
                    why: format!(
                        "its family ({} groups of {size}, {:?}) does not cover the {world} ranks \
                         once (were all ranks' traces given?)",
                        members.len(),
                        first.pg_desc
                    ),
                });
            }
            if *size > 1 {
                bounds.extend([*stride, stride * size]);
            }
        }
        bounds.sort_unstable();
        bounds.dedup();
        let mut dims = Vec::new();
        for w in bounds.windows(2) {
            if !w[1].is_multiple_of(w[0]) {
                return Err(WorldError::Layout(format!(
                    "the process groups do not make a grid of the ranks: groups repeat every \
                     {} and every {} ranks",
                    w[0], w[1]
                )));
            }
            dims.push(w[1] / w[0]);
        }
        if dims.is_empty() {
            dims.push(1);
        }
        let dim_at = |b: usize| bounds.iter().position(|&x| x == b);
        let mut families = Vec::new();
        let mut by_name = HashMap::new();
        let mut names = HashMap::new();
        for (f, ((desc, size, stride), members)) in keyed.iter().enumerate() {
            let span = if *size > 1 {
                dim_at(*stride).unwrap_or(0)..dim_at(stride * size).unwrap_or(0)
            } else {
                0..0
            };
            families.push(Family {
                desc: desc.clone(),
                dims: span.clone(),
                example: members[0].pg_name.clone(),
            });
            for g in members {
                by_name.insert(g.pg_name.clone(), f);
                // The group must be the one the grid makes for its first rank.
                let c = coords(g.ranks[0] as usize, &dims);
                if span.clone().any(|d| c[d] != 0) {
                    return Err(WorldError::Group {
                        name: g.pg_name.clone(),
                        ranks: g.ranks.clone(),
                        world,
                        why: "it does not start where the rank grid's groups start".into(),
                    });
                }
                for &r in &g.ranks {
                    names.insert((f, r as usize), g.pg_name.clone());
                }
            }
        }
        let mut layout = Layout {
            world,
            dims,
            dp: 0,
            families,
            by_name,
            names,
            world_names,
            fresh,
        };
        layout.dp = layout.data_parallel(dp)?;
        Ok(layout)
    }

    /// The data-parallel dimension. Without a family that splits the world (no subgroup, or
    /// groups of one rank: PyTorch hands a mesh dimension of every rank the world itself),
    /// the world is data parallel; a data-parallel family of one-rank groups is taken as the
    /// outermost dimension, as a device mesh puts "dp" first.
    fn data_parallel(&mut self, dp: Option<&str>) -> Result<usize, WorldError> {
        let describe = |fs: &[usize], all: &[Family]| {
            fs.iter()
                .map(|&f| format!("{:?} (e.g. group {:?})", all[f].desc, all[f].example))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let all: Vec<usize> = (0..self.families.len()).collect();
        let splitting = self.families.iter().any(|f| !f.dims.is_empty());
        let world_named =
            dp.is_some_and(|d| d == "default_pg" || self.world_names.iter().any(|w| w == d));
        let dp_of_one =
            !splitting && dp.is_none() && self.families.iter().any(|f| says_data_parallel(&f.desc));
        if ((!splitting && dp.is_none()) || world_named) && !dp_of_one {
            if self.dims.len() != 1 {
                return Err(WorldError::Layout(
                    "the world is not the data-parallel group of a job whose groups split it"
                        .into(),
                ));
            }
            return Ok(0);
        }
        let chosen: Vec<usize> = match dp {
            Some(d) => all
                .iter()
                .copied()
                .filter(|&f| self.families[f].desc == d || self.by_name.get(d) == Some(&f))
                .collect(),
            None => all
                .iter()
                .copied()
                .filter(|&f| says_data_parallel(&self.families[f].desc))
                .collect(),
        };
        let f = match chosen.as_slice() {
            [f] => *f,
            [] => {
                return Err(WorldError::Layout(match dp {
                    Some(d) if all.is_empty() => format!(
                        "--data-parallel {d}: the job has no subgroups, so its world is the \
                         data-parallel group: leave out --data-parallel"
                    ),
                    Some(d) => format!(
                        "--data-parallel {d}: no process group family is {d:?}; the job's are {}",
                        describe(&all, &self.families)
                    ),
                    None => format!(
                        "which groups are the data-parallel ones is not said by their \
                         descriptions: name them with --data-parallel DESC (the job's: {})",
                        describe(&all, &self.families)
                    ),
                }))
            }
            several => {
                return Err(WorldError::Layout(format!(
                    "several process group families could be the data-parallel one: {}; name \
                     one with --data-parallel and one of its groups' pg_name",
                    describe(several, &self.families)
                )))
            }
        };
        let span = self.families[f].dims.clone();
        if span.is_empty() && !splitting {
            // (dp 1, tp N): PyTorch hands the dimension of every rank the world itself, so
            // the world's collectives are the other dimension's, which grows no more.
            return Err(WorldError::Layout(format!(
                "the data-parallel groups {:?} have one rank each and no other group splits the \
                 world: its collectives belong to a model-parallel group of every rank, which \
                 cannot be told apart from the world at a larger size",
                self.families[f].desc
            )));
        }
        if span.is_empty() {
            // Groups of one rank: a dimension of size 1, outermost.
            self.dims.push(1);
            let d = self.dims.len() - 1;
            self.families[f].dims = d..d + 1;
            return Ok(d);
        }
        if span.len() != 1 {
            return Err(WorldError::Layout(format!(
                "the data-parallel groups {:?} (e.g. {:?}) span {} dimensions of the rank grid \
                 that other groups split; compose world grows one",
                self.families[f].desc,
                self.families[f].example,
                span.len()
            )));
        }
        Ok(span.start)
    }

    /// The dimension sizes in the capture, innermost first.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The dimension sizes at world size `n`: the data-parallel one grown.
    pub fn sizes_at(&self, n: usize) -> Result<Vec<usize>, WorldError> {
        let d = self.dims[self.dp];
        let rest = self.world / d;
        if !n.is_multiple_of(rest) {
            let what = match self.families.iter().find(|f| f.dims.contains(&self.dp)) {
                Some(f) => format!("the data-parallel groups {:?}", f.desc),
                None => "the world".into(),
            };
            return Err(WorldError::Layout(format!(
                "--world {n}: {what} grow by whole replicas of the other {rest} ranks; the world \
                 must be a multiple of {rest}"
            )));
        }
        let mut sizes = self.dims.clone();
        sizes[self.dp] = n / rest;
        Ok(sizes)
    }

    /// The captured rank new rank `rank` (of `sizes`) is made from.
    pub fn template(&self, rank: usize, sizes: &[usize]) -> usize {
        let mut c = coords(rank, sizes);
        c[self.dp] = c[self.dp].min(self.dims[self.dp] - 1);
        rank_of(&c, &self.dims)
    }

    /// Whether the job has process groups besides the world.
    pub fn has_subgroups(&self) -> bool {
        !self.families.is_empty()
    }

    /// The family a group name belongs to; `None` for the world.
    pub fn family(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Whether `name` is the world group's.
    pub fn is_world_name(&self, name: &str) -> bool {
        self.world_names.iter().any(|w| w == name)
    }

    /// Rank `rank`'s group in family `f` (or the world) at `sizes`.
    pub fn place(&self, f: Option<usize>, rank: usize, sizes: &[usize]) -> Place {
        let n: usize = sizes.iter().product();
        let Some(f) = f else {
            return Place {
                name: self.world_names[0].clone(),
                size: n,
                me: rank,
                start: 0,
                stride: 1,
            };
        };
        let span = self.families[f].dims.clone();
        let c = coords(rank, sizes);
        let strides = strides(sizes);
        let size: usize = sizes[span.clone()].iter().product();
        let mut me = 0;
        for d in span.clone().rev() {
            me = me * sizes[d] + c[d];
        }
        let start = rank - span.clone().map(|d| c[d] * strides[d]).sum::<usize>();
        // A group of one rank has stride 0, as PyTorch records it.
        let stride = if size > 1 {
            span.clone().next().map_or(0, |d| strides[d])
        } else {
            0
        };
        // A group the capture had keeps its name: the one whose ranks' coordinates outside
        // the family are all within the capture.
        let captured = c
            .iter()
            .zip(&self.dims)
            .enumerate()
            .all(|(d, (&x, &s))| span.contains(&d) || x < s);
        let name = if captured {
            let mut cc = c.clone();
            for d in span.clone() {
                cc[d] = 0;
            }
            let r0 = rank_of(&cc, &self.dims);
            self.names.get(&(f, r0)).cloned().unwrap_or_default()
        } else {
            // New: numbered past the capture's names, per family in turn, by the group's
            // index among the family's groups at this size.
            let before: usize = (0..f).map(|g| n / self.family_size(g, sizes)).sum();
            let mut index = 0;
            for d in (0..sizes.len()).rev().filter(|d| !span.contains(d)) {
                index = index * sizes[d] + c[d];
            }
            (self.fresh + (before + index) as u64).to_string()
        };
        Place {
            name,
            size,
            me,
            start,
            stride,
        }
    }

    /// The world-group peer of new rank `to` (made from captured rank `from`) whose captured
    /// peer was global rank `p`: the rank at the peer's place in every dimension but the
    /// data-parallel one, and there at the same offset from the rank, the short way round.
    pub fn world_peer(
        &self,
        from: usize,
        to: usize,
        p: usize,
        sizes: &[usize],
        send: bool,
    ) -> usize {
        let (cf, ct) = (coords(from, &self.dims), coords(to, sizes));
        let mut c = coords(p % self.world.max(1), &self.dims);
        let d = self.dp;
        c[d] = super::peer_at(cf[d], ct[d], self.dims[d], sizes[d], c[d] as i64, send) as usize;
        rank_of(&c, sizes)
    }

    fn family_size(&self, f: usize, sizes: &[usize]) -> usize {
        sizes[self.families[f].dims.clone()].iter().product()
    }

    /// How many groups the job has at `sizes`, the world included.
    pub fn group_count(&self, sizes: &[usize]) -> usize {
        let n: usize = sizes.iter().product();
        1 + (0..self.families.len())
            .map(|f| n / self.family_size(f, sizes))
            .sum::<usize>()
    }

    /// Each family's groups before and after, the world first.
    pub fn report(&self, sizes: &[usize]) -> Vec<GroupsScaled> {
        let n: usize = sizes.iter().product();
        let mut out = vec![GroupsScaled {
            desc: "default_pg".into(),
            data_parallel: !self.has_subgroups(),
            groups_before: 1,
            size_before: self.world,
            groups_after: 1,
            size_after: n,
        }];
        for (f, fam) in self.families.iter().enumerate() {
            let (a, b) = (self.family_size(f, &self.dims), self.family_size(f, sizes));
            out.push(GroupsScaled {
                desc: fam.desc.clone(),
                data_parallel: fam.dims.contains(&self.dp),
                groups_before: self.world / a,
                size_before: a,
                groups_after: n / b,
                size_after: b,
            });
        }
        out
    }
}

/// Whether a group record is the world's.
pub(super) fn is_world(g: &PgInit, world: usize) -> bool {
    g.pg_desc == "default_pg"
        || g.ranks.is_empty()
        || (g.ranks.len() == world && g.ranks.iter().enumerate().all(|(k, &r)| r == k as i64))
}

/// Whether a description says data parallel: a word `dp`, or one starting `data`
/// (`mesh_dp`, `DATA_PARALLEL_GROUP`, `dp_group`).
fn says_data_parallel(desc: &str) -> bool {
    desc.to_ascii_lowercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| w == "dp" || w.starts_with("data"))
}

/// The strides of dimensions of `sizes` (innermost first).
fn strides(sizes: &[usize]) -> Vec<usize> {
    let mut s = Vec::with_capacity(sizes.len());
    let mut at = 1;
    for &d in sizes {
        s.push(at);
        at *= d;
    }
    s
}

/// A rank's coordinates in a grid of `sizes`.
fn coords(mut rank: usize, sizes: &[usize]) -> Vec<usize> {
    sizes
        .iter()
        .map(|&d| {
            let c = rank % d;
            rank /= d;
            c
        })
        .collect()
}

/// The rank at coordinates `c` of a grid of `sizes`.
fn rank_of(c: &[usize], sizes: &[usize]) -> usize {
    c.iter().zip(sizes).rev().fold(0, |r, (&x, &d)| r * d + x)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg(name: &str, desc: &str, ranks: &[i64]) -> PgInit {
        PgInit {
            pg_name: name.into(),
            pg_desc: desc.into(),
            backend_config: String::new(),
            ranks: ranks.to_vec(),
            group_size: ranks.len() as i64,
            rest: Default::default(),
        }
    }

    /// A 2 x 2 mesh ("dp", "tp"), TP ranks adjacent, as each rank records its groups.
    fn mesh_2x2() -> Vec<Vec<PgInit>> {
        let world = pg("0", "default_pg", &[]);
        (0..4)
            .map(|r| {
                let dp = if r % 2 == 0 {
                    pg("1", "mesh_dp", &[0, 2])
                } else {
                    pg("2", "mesh_dp", &[1, 3])
                };
                let tp = if r < 2 {
                    pg("3", "mesh_tp", &[0, 1])
                } else {
                    pg("4", "mesh_tp", &[2, 3])
                };
                vec![world.clone(), dp, tp]
            })
            .collect()
    }

    #[test]
    fn a_mesh_grows_its_data_parallel_dimension() {
        let l = Layout::new(&mesh_2x2(), 4, None).unwrap();
        let sizes = l.sizes_at(8).unwrap();
        assert_eq!(sizes, vec![2, 4]);
        // New rank 5 = (tp 1, dp 2): made from captured (tp 1, dp 1) = rank 3.
        assert_eq!(l.template(5, &sizes), 3);
        assert_eq!(l.template(2, &sizes), 2);
        let dp = l.family("1");
        let tp = l.family("3");
        assert_eq!(dp, l.family("2"));
        // Its dp group: the captured "2" grown to [1, 3, 5, 7].
        let p = l.place(dp, 5, &sizes);
        assert_eq!(
            (p.name.as_str(), p.size, p.me, p.start, p.stride),
            ("2", 4, 2, 1, 2)
        );
        // Its tp group is new ([4, 5]), named past the capture's names, the same for rank 4.
        let p = l.place(tp, 5, &sizes);
        assert_eq!((p.size, p.me, p.start, p.stride), (2, 1, 4, 1));
        assert_eq!(p.name, l.place(tp, 4, &sizes).name);
        assert!(p.name.parse::<u64>().unwrap() >= 5);
        assert_ne!(p.name, l.place(tp, 6, &sizes).name);
        // Captured tp groups keep their names.
        assert_eq!(l.place(tp, 3, &sizes).name, "4");
        assert_eq!(l.group_count(&sizes), 1 + 2 + 4);
        assert_eq!(l.sizes_at(6).unwrap(), vec![2, 3]);
        let e = l.sizes_at(7).unwrap_err().to_string();
        assert!(e.contains("mesh_dp") && e.contains("multiple of 2"), "{e}");
    }

    #[test]
    fn groups_not_on_a_grid_or_unnamed_data_parallel_are_refused() {
        let world = pg("0", "default_pg", &[]);
        // Two families of size 2 neither of which says data parallel.
        let recs: Vec<Vec<PgInit>> = mesh_2x2()
            .into_iter()
            .map(|v| {
                v.into_iter()
                    .map(|mut g| {
                        g.pg_desc = g
                            .pg_desc
                            .replace("mesh_dp", "mesh_a")
                            .replace("mesh_tp", "mesh_b");
                        g
                    })
                    .collect()
            })
            .collect();
        let e = Layout::new(&recs, 4, None).unwrap_err().to_string();
        assert!(e.contains("--data-parallel") && e.contains("mesh_a"), "{e}");
        let l = Layout::new(&recs, 4, Some("mesh_b")).unwrap();
        // mesh_b (stride 1) grown: rank 5 of 8 = (b 1, a 1) with b of size 4.
        let sizes = l.sizes_at(8).unwrap();
        assert_eq!(sizes, vec![4, 2]);
        // A group whose ranks are not evenly spaced.
        let odd = vec![vec![world.clone(), pg("1", "x", &[0, 2, 3])]];
        let e = Layout::new(&odd, 4, None).unwrap_err().to_string();
        assert!(e.contains("\"1\"") && e.contains("evenly"), "{e}");
        // A family that does not cover the world (a rank's trace missing).
        let part = vec![vec![world, pg("1", "mesh_dp", &[0, 2])]];
        let e = Layout::new(&part, 4, None).unwrap_err().to_string();
        assert!(e.contains("cover"), "{e}");
    }

    #[test]
    fn a_world_alone_is_its_data_parallel_dimension() {
        let l = Layout::new(&[vec![pg("0", "default_pg", &[])]], 2, None).unwrap();
        let sizes = l.sizes_at(5).unwrap();
        assert_eq!(sizes, vec![5]);
        assert_eq!(l.template(4, &sizes), 1);
        assert_eq!(l.place(None, 4, &sizes).size, 5);
    }

    /// A ("pp", "dp") 2 x 2 mesh, data parallel innermost: a stage's send to the next stage
    /// on the world group goes to the same data-parallel rank of the next stage at any size.
    #[test]
    fn world_peers_keep_their_place_in_the_other_dimensions() {
        let world = pg("0", "default_pg", &[]);
        let recs: Vec<Vec<PgInit>> = (0..4)
            .map(|r| {
                let dp = if r < 2 {
                    pg("1", "mesh_dp", &[0, 1])
                } else {
                    pg("2", "mesh_dp", &[2, 3])
                };
                let pp = if r % 2 == 0 {
                    pg("3", "mesh_pp", &[0, 2])
                } else {
                    pg("4", "mesh_pp", &[1, 3])
                };
                vec![world.clone(), dp, pp]
            })
            .collect();
        let l = Layout::new(&recs, 4, None).unwrap();
        let sizes = l.sizes_at(8).unwrap();
        assert_eq!(sizes, vec![4, 2]);
        // Captured rank 0 sends to 2 (stage 1, dp 0); at 8 ranks stage 1 starts at 4.
        assert_eq!(l.world_peer(0, 0, 2, &sizes, true), 4);
        // New rank 3 (dp 3, stage 0) is made from captured rank 1; its peer is rank 7.
        assert_eq!(l.template(3, &sizes), 1);
        assert_eq!(l.world_peer(1, 3, 3, &sizes, true), 7);
        // And the receive back: rank 7 (from captured 3) receives from 3.
        assert_eq!(l.world_peer(3, 7, 1, &sizes, false), 3);
    }

    /// A second group of every rank (a CPU barrier group) is the world's kind, not a family;
    /// a mesh whose data-parallel dimension is every rank hands it the world, leaving groups
    /// of one rank; a combined group given before the ones that split it makes the same grid.
    #[test]
    fn world_groups_one_rank_groups_and_combined_groups() {
        let mut recs = mesh_2x2();
        for r in &mut recs {
            r.push(pg("5", "cpu_barrier", &[]));
        }
        let l = Layout::new(&recs, 4, None).unwrap();
        assert!(l.is_world_name("5") && l.is_world_name("0"));
        assert_eq!(l.sizes_at(8).unwrap(), vec![2, 4]);
        // (dp 4, tp 1): the world is data parallel.
        let recs: Vec<Vec<PgInit>> = (0..4)
            .map(|r| {
                vec![
                    pg("0", "default_pg", &[]),
                    pg(&(1 + r).to_string(), "mesh_tp", &[r as i64]),
                ]
            })
            .collect();
        let l = Layout::new(&recs, 4, None).unwrap();
        let sizes = l.sizes_at(6).unwrap();
        assert_eq!(sizes, vec![6]);
        assert_eq!(l.template(5, &sizes), 3);
        let p = l.place(l.family("1"), 5, &sizes);
        assert_eq!((p.size, p.stride, p.start), (1, 0, 5));
        // (x 2, dp 2, tp 2) with a flattened dp_tp group listed first and no tp groups.
        let recs: Vec<Vec<PgInit>> = (0..8)
            .map(|r: i64| {
                let base = r / 4 * 4;
                let dp_tp = pg(
                    &format!("{}", 10 + base),
                    "dp_tp",
                    &[base, base + 1, base + 2, base + 3],
                );
                let dp = pg(
                    &format!("{}", 20 + r / 4 * 2 + r % 2),
                    "mesh_dp",
                    &[base + r % 2, base + r % 2 + 2],
                );
                vec![pg("0", "default_pg", &[]), dp_tp, dp]
            })
            .collect();
        // "dp_tp" says data parallel too: which one is asked for.
        let e = Layout::new(&recs, 8, None).unwrap_err().to_string();
        assert!(e.contains("several") && e.contains("dp_tp"), "{e}");
        let l = Layout::new(&recs, 8, Some("mesh_dp")).unwrap();
        assert_eq!(l.sizes_at(16).unwrap(), vec![2, 4, 2]);
        let p = l.place(l.family("10"), 5, &l.sizes_at(16).unwrap());
        assert_eq!((p.size, p.start, p.stride), (8, 0, 1));
    }

    #[test]
    fn grids_number_ranks_innermost_first() {
        let sizes = [2, 3, 4];
        for r in 0..24 {
            assert_eq!(rank_of(&coords(r, &sizes), &sizes), r);
        }
    }
}
