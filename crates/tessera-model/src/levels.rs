//! Network topology above the node: ordered levels (rack, block or spine, …) from the node up to
//! the pool, and each node's place at each level.
//!
//! A fleet's [`Levels`] name its levels from the lowest (a rack: the nodes behind one leaf
//! switch) upwards; the node below them and the pool above them are implicit. At each level the
//! nodes are grouped into *domains* (rack `r0`, block `b1`). The values come from the fleet file
//! (`rack`, `nodes_per_rack`, `block` per node group, see `fleets/seed.toml`) or from any source
//! of per-node values such as Kubernetes node labels ([`Levels::build`] takes level names and a
//! value per node and level, the way Kueue's Topology object names node label keys).
//!
//! The rules, checked when levels are built: level names are distinct and are not `node` or
//! `pool`; a domain holds nodes of one pool only and lies within one domain of each level above
//! it; within a pool either every node has a value at a level or none has (a pool without racks
//! is flat at that level). Domain names are unique per level across the fleet.

use std::collections::HashMap;
use std::fmt;

use crate::fleet::{Node, NodeId, PoolId};

/// No domain at this level (the node's pool does not declare the level).
const NONE: u32 = u32::MAX;

/// A group of nodes at one level: a rack, a block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Domain {
    pub name: String,
    pub pool: PoolId,
    /// The domain holding this one at the next level up that its pool declares, if any.
    pub parent: Option<u32>,
    /// Its nodes, in fleet order.
    pub nodes: Vec<u32>,
}

/// The levels above the node and every node's domain at each of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Levels {
    /// Level names, lowest first (`["rack", "block"]`).
    names: Vec<String>,
    /// `domains[level]`: that level's domains.
    domains: Vec<Vec<Domain>>,
    /// `of_node[level][node]`: the node's domain at that level, or [`NONE`].
    of_node: Vec<Vec<u32>>,
}

/// Levels that break a rule; names the node (when one is at fault) and the level.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}{level}: {message}", node.as_ref().map(|n| format!("node `{n}`: ")).unwrap_or_default())]
pub struct LevelError {
    /// Index of the node at fault in the fleet's node list, if one is.
    pub node_index: Option<usize>,
    pub node: Option<String>,
    pub level: String,
    pub message: String,
}

impl Levels {
    /// No level above the node: every pool is flat.
    pub fn none() -> Levels {
        Levels::default()
    }

    /// Builds levels over `nodes` (a fleet's node list, with their pools): `names` lowest
    /// first, and `value(node index, level index)` the node's domain name at that level, or
    /// `None` where its pool does not declare the level.
    pub fn build(
        nodes: &[Node],
        names: &[String],
        mut value: impl FnMut(usize, usize) -> Option<String>,
    ) -> Result<Levels, LevelError> {
        let fail = |node: Option<usize>, level: &str, message: String| LevelError {
            node_index: node,
            node: node.map(|i| nodes[i].name.clone()),
            level: level.to_string(),
            message,
        };
        for (i, n) in names.iter().enumerate() {
            if n.is_empty()
                || !n
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
            {
                return Err(fail(None, n, format!("`{n}` is not a valid level name")));
            }
            if n == "node" || n == "pool" {
                return Err(fail(
                    None,
                    n,
                    "`node` and `pool` are implicit (below and above every level)".into(),
                ));
            }
            if names[..i].contains(n) {
                return Err(fail(None, n, format!("level `{n}` is named twice")));
            }
        }
        let mut levels = Levels {
            names: names.to_vec(),
            domains: vec![Vec::new(); names.len()],
            of_node: vec![vec![NONE; nodes.len()]; names.len()],
        };
        // Per level, domain name → index; per (level, pool), whether its nodes have values
        // (decided by the pool's first node).
        let mut by_name: Vec<HashMap<String, u32>> = vec![HashMap::new(); names.len()];
        let mut pool_has: HashMap<(usize, PoolId), (bool, usize)> = HashMap::new();
        for (ni, node) in nodes.iter().enumerate() {
            for (l, lname) in names.iter().enumerate() {
                let v = value(ni, l).map(|v| v.trim().to_string());
                if let Some(v) = &v
                    && v.is_empty()
                {
                    return Err(fail(Some(ni), lname, format!("an empty {lname} name")));
                }
                let (has, first) = *pool_has.entry((l, node.pool)).or_insert((v.is_some(), ni));
                if has != v.is_some() {
                    let (with, without) = if has { (first, ni) } else { (ni, first) };
                    return Err(fail(
                        Some(without),
                        lname,
                        format!(
                            "no {lname}, but node `{}` of the same pool has one: within a pool every node has a {lname} or none has",
                            nodes[with].name
                        ),
                    ));
                }
                let Some(v) = v else { continue };
                let d = match by_name[l].get(&v) {
                    Some(&d) => {
                        let dom = &levels.domains[l][d as usize];
                        if dom.pool != node.pool {
                            let other = &nodes[dom.nodes[0] as usize];
                            return Err(fail(
                                Some(ni),
                                lname,
                                format!(
                                    "{lname} `{v}` holds node `{}` of another pool; a {lname} belongs to one pool",
                                    other.name
                                ),
                            ));
                        }
                        d
                    }
                    None => {
                        let d = levels.domains[l].len() as u32;
                        by_name[l].insert(v.clone(), d);
                        levels.domains[l].push(Domain {
                            name: v,
                            pool: node.pool,
                            parent: None,
                            nodes: Vec::new(),
                        });
                        d
                    }
                };
                levels.domains[l][d as usize].nodes.push(ni as u32);
                levels.of_node[l][ni] = d;
            }
        }
        // Nesting: each domain lies within one domain of every level above it.
        for l in 0..names.len() {
            for d in 0..levels.domains[l].len() {
                let members = &levels.domains[l][d].nodes;
                for up in l + 1..names.len() {
                    let first = levels.of_node[up][members[0] as usize];
                    if let Some(&bad) = members.iter().find(|&&n| levels.of_node[up][n as usize] != first) {
                        let name = |n: u32| match levels.of_node[up][n as usize] {
                            NONE => "none".to_string(),
                            x => format!("`{}`", levels.domains[up][x as usize].name),
                        };
                        return Err(fail(
                            Some(bad as usize),
                            &names[up],
                            format!(
                                "{} `{}` lies in {} {} and {}; a {} lies within one {}",
                                names[l],
                                levels.domains[l][d].name,
                                names[up],
                                name(members[0]),
                                name(bad),
                                names[l],
                                names[up]
                            ),
                        ));
                    }
                }
            }
        }
        for l in 0..names.len() {
            for d in 0..levels.domains[l].len() {
                let n0 = levels.domains[l][d].nodes[0] as usize;
                levels.domains[l][d].parent = (l + 1..names.len())
                    .map(|up| levels.of_node[up][n0])
                    .find(|&p| p != NONE);
            }
        }
        Ok(levels)
    }

    /// Whether the fleet declares no level above the node.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The level names, lowest first.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The index of a level by name.
    pub fn level(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// The domains of `level`.
    pub fn domains(&self, level: usize) -> &[Domain] {
        &self.domains[level]
    }

    /// Node `node`'s domain at `level`, if its pool declares the level.
    pub fn domain_of(&self, level: usize, node: NodeId) -> Option<u32> {
        self.of_node
            .get(level)
            .and_then(|v| v.get(node.0 as usize))
            .copied()
            .filter(|&d| d != NONE)
    }

    /// The name of node `node`'s domain at `level`.
    pub fn domain_name(&self, level: usize, node: NodeId) -> Option<&str> {
        self.domain_of(level, node)
            .map(|d| self.domains[level][d as usize].name.as_str())
    }

    /// Node `node`'s place at each level its pool declares, lowest first: `(level, domain)`.
    pub fn path(&self, node: NodeId) -> Vec<(&str, &str)> {
        (0..self.names.len())
            .filter_map(|l| self.domain_name(l, node).map(|d| (self.names[l].as_str(), d)))
            .collect()
    }

    /// Whether any node of `pool` has a domain at `level`.
    pub fn pool_has(&self, level: usize, pool: PoolId) -> bool {
        self.domains
            .get(level)
            .is_some_and(|ds| ds.iter().any(|d| d.pool == pool))
    }
}

impl fmt::Display for Levels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("node")?;
        for n in &self.names {
            write!(f, " → {n}")?;
        }
        f.write_str(" → pool")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::ModelId;
    use crate::fleet::Topology;

    fn nodes(pools: &[u16]) -> Vec<Node> {
        pools
            .iter()
            .enumerate()
            .map(|(i, &p)| Node {
                name: format!("n{i}"),
                pool: PoolId(p),
                model: ModelId(0),
                gpus: 8,
                cpu_milli: 1000,
                memory_mib: 1024,
                topology: Topology::NvSwitch,
            })
            .collect()
    }

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn builds_domains_parents_and_paths() {
        let ns = nodes(&[0, 0, 0, 0, 1]);
        let racks = ["r0", "r0", "r1", "r1"];
        let l = Levels::build(&ns, &names(&["rack", "block"]), |n, l| match (n, l) {
            (4, _) => None,
            (n, 0) => Some(racks[n].into()),
            (_, _) => Some("b0".into()),
        })
        .unwrap();
        assert_eq!(l.domains(0).len(), 2);
        assert_eq!(l.domains(0)[1].nodes, vec![2, 3]);
        assert_eq!(l.domains(0)[1].parent, Some(0));
        assert_eq!(l.domains(1)[0].parent, None);
        assert_eq!(l.path(NodeId(2)), vec![("rack", "r1"), ("block", "b0")]);
        assert!(l.path(NodeId(4)).is_empty());
        assert!(l.pool_has(0, PoolId(0)) && !l.pool_has(0, PoolId(1)));
        assert_eq!(l.level("block"), Some(1));
        assert_eq!(l.to_string(), "node → rack → block → pool");
    }

    #[test]
    fn errors_name_the_node_and_level() {
        let ns = nodes(&[0, 0, 1]);
        // A rack across pools.
        let e = Levels::build(&ns, &names(&["rack"]), |_, _| Some("r0".into())).unwrap_err();
        assert_eq!((e.node_index, e.level.as_str()), (Some(2), "rack"), "{e}");
        assert!(e.to_string().contains("belongs to one pool"), "{e}");
        // A node of a racked pool without a rack.
        let e = Levels::build(&ns, &names(&["rack"]), |n, _| (n != 1).then(|| format!("r{n}"))).unwrap_err();
        assert_eq!(e.node.as_deref(), Some("n1"), "{e}");
        assert!(e.message.contains("every node has a rack or none has"), "{e}");
        // A rack in two blocks.
        let e = Levels::build(&ns[..2], &names(&["rack", "block"]), |n, l| {
            Some(if l == 0 { "r0".into() } else { format!("b{n}") })
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "node `n1`: block: rack `r0` lies in block `b0` and `b1`; a rack lies within one block"
        );
        // Bad level names.
        for bad in [&["node"][..], &["rack", "rack"], &[""]] {
            assert!(Levels::build(&ns, &names(bad), |_, _| None).is_err(), "{bad:?}");
        }
    }
}
