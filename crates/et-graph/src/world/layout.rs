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
    /// The world group's name.
    world_name: String,
    /// Names of groups the capture did not have start here (past every numeric name).
    fresh: u64,
}

impl Layout {
    /// The layout of a `world`-rank job whose ranks recorded `records`; `dp` names the
    /// data-parallel groups (a description, or one of their names), else they are the
    /// family whose description says data parallel (`mesh_dp`, `DATA_PARALLEL_GROUP`), or the
    /// world where there is no subgroup.
    pub fn new(
        records: &[Vec<PgInit>],
        world: usize,
        dp: Option<&str>,
    ) -> Result<Layout, WorldError> {
        let mut world_name = "0".to_string();
        let mut fresh = 0u64;
        // Every group once, by name (each rank records the groups it is in).
        let mut groups: Vec<&PgInit> = Vec::new();
        for g in records.iter().flatten() {
            if let Ok(k) = g.pg_name.parse::<u64>() {
                fresh = fresh.max(k + 1);
            }
            if is_world(g, world) {
                world_name = g.pg_name.clone();
                continue;
            }
            if !groups.iter().any(|x| x.pg_name == g.pg_name) {
                groups.push(g);
            }
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
            let stride = if ranks.len() > 1 {
                ranks[1].saturating_sub(ranks[0])
            } else {
                1
            };
            let progression = stride > 0
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
        // Dimensions, innermost first, from the families' strides.
        keyed.sort_by_key(|((_, size, stride), _)| (*stride, *size));
        let mut dims: Vec<usize> = Vec::new();
        let mut families = Vec::new();
        for ((desc, size, stride), members) in &keyed {
            let first = members[0];
            let bad = |why: String| WorldError::Group {
                name: first.pg_name.clone(),
                ranks: first.ranks.clone(),
                world,
                why,
            };
            let covered: usize = members.len() * size;
            if covered != world {
                return Err(bad(format!(
                    "its family ({} groups of {size}, {desc:?}) does not cover the {world} ranks \
                     once (were all ranks' traces given?)",
                    members.len()
                )));
            }
            let span = if *size == 1 {
                0..0
            } else {
                span_of(&mut dims, *stride, *size).ok_or_else(|| {
                    bad(format!(
                        "its stride {stride} and size {size} do not fit the rank grid the other \
                         groups make"
                    ))
                })?
            };
            families.push(Family {
                desc: desc.clone(),
                dims: span,
                example: first.pg_name.clone(),
            });
        }
        let inner: usize = dims.iter().product();
        if !world.is_multiple_of(inner) {
            return Err(WorldError::Layout(format!(
                "the groups make a grid of {inner} ranks, which does not divide the world of {world}"
            )));
        }
        if world > inner {
            dims.push(world / inner);
        }
        let mut by_name = HashMap::new();
        let mut names = HashMap::new();
        let mut layout = Layout {
            world,
            dims,
            dp: 0,
            families,
            by_name: HashMap::new(),
            names: HashMap::new(),
            world_name,
            fresh,
        };
        // Families are in `keyed`'s order.
        for (f, (_, members)) in keyed.iter().enumerate() {
            for g in members {
                by_name.insert(g.pg_name.clone(), f);
                // The group must be the one the grid makes for its first rank.
                let r0 = g.ranks[0] as usize;
                let c = coords(r0, &layout.dims);
                if layout.families[f].dims.clone().any(|d| c[d] != 0) {
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
        layout.by_name = by_name;
        layout.names = names;
        layout.dp = layout.data_parallel(dp)?;
        Ok(layout)
    }

    /// The data-parallel dimension.
    fn data_parallel(&self, dp: Option<&str>) -> Result<usize, WorldError> {
        let list = || {
            self.families
                .iter()
                .map(|f| format!("{:?} (e.g. group {:?})", f.desc, f.example))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if self.families.is_empty() {
            return match dp {
                None => Ok(0),
                Some(d) => Err(WorldError::Layout(format!(
                    "--data-parallel {d}: the job has no process group but the world"
                ))),
            };
        }
        let chosen: Vec<usize> = match dp {
            Some(d) => (0..self.families.len())
                .filter(|&f| self.families[f].desc == d || self.by_name.get(d) == Some(&f))
                .collect(),
            None => (0..self.families.len())
                .filter(|&f| says_data_parallel(&self.families[f].desc))
                .collect(),
        };
        let f = match chosen.as_slice() {
            [f] => *f,
            [] => {
                return Err(WorldError::Layout(match dp {
                    Some(d) => format!(
                        "--data-parallel {d}: no process group family is {d:?}; the job's are {}",
                        list()
                    ),
                    None => format!(
                        "which groups are the data-parallel ones is not said by their \
                         descriptions: name them with --data-parallel DESC (the job's: {})",
                        list()
                    ),
                }))
            }
            _ => {
                return Err(WorldError::Layout(format!(
                    "several process group families could be the data-parallel one: {}; name \
                     one with --data-parallel",
                    list()
                )))
            }
        };
        let span = self.families[f].dims.clone();
        if span.len() != 1 {
            return Err(WorldError::Layout(format!(
                "the data-parallel groups {:?} (e.g. {:?}) span {} dimensions of the rank grid; \
                 compose world grows one",
                self.families[f].desc,
                self.families[f].example,
                span.len()
            )));
        }
        Ok(span.start)
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
        name == self.world_name
    }

    /// Rank `rank`'s group in family `f` (or the world) at `sizes`.
    pub fn place(&self, f: Option<usize>, rank: usize, sizes: &[usize]) -> Place {
        let n: usize = sizes.iter().product();
        let Some(f) = f else {
            return Place {
                name: self.world_name.clone(),
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
        let stride = span.clone().next().map_or(1, |d| strides[d]);
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

/// The dimensions a family of stride `stride` and size `size` spans, adding what the grid
/// lacks (a dimension of ranks below the stride, the family's own); `None` where it does not
/// fit the grid.
fn span_of(dims: &mut Vec<usize>, stride: usize, size: usize) -> Option<Range<usize>> {
    let mut at = 1usize;
    let mut k = 0;
    while k < dims.len() && at < stride {
        at *= dims[k];
        k += 1;
    }
    if at < stride {
        // Past the grid: ranks between it and the stride make a dimension of their own.
        if !stride.is_multiple_of(at) {
            return None;
        }
        if stride > at {
            dims.push(stride / at);
        }
        dims.push(size);
        return Some(dims.len() - 1..dims.len());
    }
    if at != stride {
        return None;
    }
    let start = k;
    let mut covered = 1usize;
    while k < dims.len() && covered < size {
        covered *= dims[k];
        k += 1;
    }
    if covered == size {
        return Some(start..k);
    }
    if covered > size || !size.is_multiple_of(covered) || k < dims.len() {
        return None;
    }
    dims.push(size / covered);
    Some(start..dims.len())
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

    #[test]
    fn grids_number_ranks_innermost_first() {
        let sizes = [2, 3, 4];
        for r in 0..24 {
            assert_eq!(rank_of(&coords(r, &sizes), &sizes), r);
        }
        let mut dims = vec![2];
        // A family of stride 1 over 4 ranks spans the stride-1 dimension and a new one.
        assert_eq!(span_of(&mut dims, 1, 4), Some(0..2));
        assert_eq!(dims, vec![2, 2]);
        // Stride 8 past a grid of 4: a dimension of 2 between.
        assert_eq!(span_of(&mut dims, 8, 2), Some(3..4));
        assert_eq!(dims, vec![2, 2, 2, 2]);
        assert_eq!(span_of(&mut vec![2, 2], 3, 2), None);
    }
}
