//! Per-entity named values ([`crate::model::Counts`], [`crate::model::Metrics`]) that share
//! their names.
//!
//! A report holds one map of counters and one of metrics per entity (every thread, process,
//! function and call edge), all with the same dozen or two names. As `BTreeMap<String, _>`
//! each entity paid for its own tree nodes and its own heap copy of every name: ~4.5 KB per
//! thread at level 2, ~620 MB for a report of 100,000 threads. A [`Name`] is a shared
//! pointer, and a [`NamedMap`] keeps its names as one sorted slice shared with the maps it was
//! cloned from, beside its own values: entities built from one template (the counter plan's
//! slot names, a model's metric names) hold their values and a pointer, not the names.
//!
//! Iteration is in name order (`str`'s), as `BTreeMap<String, _>`'s was, so everything that
//! prints or serializes these maps (tables, JSON, CSV) writes the same bytes as before.

use std::{
    borrow::Borrow,
    fmt,
    ops::{Deref, Index, IndexMut},
    sync::Arc,
};

use serde::{
    Deserialize, Deserializer, Serialize, Serializer,
    de::{MapAccess, Visitor},
    ser::SerializeMap,
};

/// A counter's or metric's name, shared: cloning one copies a pointer. Compares, orders and
/// hashes as the `str` it holds.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(Arc<str>);

impl Name {
    pub fn new(name: &str) -> Self {
        Self(Arc::from(name))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for Name {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<&str> for Name {
    fn from(name: &str) -> Self {
        Self::new(name)
    }
}

impl From<&String> for Name {
    fn from(name: &String) -> Self {
        Self::new(name)
    }
}

impl From<String> for Name {
    fn from(name: String) -> Self {
        Self(Arc::from(name))
    }
}

impl From<&Name> for Name {
    fn from(name: &Name) -> Self {
        name.clone()
    }
}

impl From<Name> for String {
    fn from(name: Name) -> Self {
        name.0.as_ref().to_owned()
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Name {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<Name> for str {
    fn eq(&self, other: &Name) -> bool {
        self == &*other.0
    }
}

impl PartialEq<Name> for &str {
    fn eq(&self, other: &Name) -> bool {
        *self == &*other.0
    }
}

impl PartialEq<Name> for String {
    fn eq(&self, other: &Name) -> bool {
        **self == *other.0
    }
}

impl Serialize for Name {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Name::from)
    }
}

/// Values by [`Name`], iterated in name order: the `BTreeMap<String, V>` API the report code
/// uses. The names are one sorted slice with no name twice, shared by the maps cloned from one
/// another (every entity's counters are a clone of one template, every entity's metrics of
/// another), so each map owns only its values; a name is looked up by binary search.
/// Adding or removing a name copies the names (these maps hold tens of entries, and the
/// report's maps are built whole, not grown).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct NamedMap<V> {
    /// `None` when empty, so an empty map allocates nothing.
    names: Option<Arc<[Name]>>,
    /// The value of each of `names`, by position.
    values: Box<[V]>,
}

impl<V> Default for NamedMap<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V> NamedMap<V> {
    pub fn new() -> Self {
        Self {
            names: None,
            values: Box::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn clear(&mut self) {
        *self = Self::new();
    }

    fn names(&self) -> &[Name] {
        self.names.as_deref().unwrap_or(&[])
    }

    fn position(&self, key: &str) -> Result<usize, usize> {
        self.names().binary_search_by(|name| name.as_str().cmp(key))
    }

    pub fn get(&self, key: &str) -> Option<&V> {
        let index = self.position(key).ok()?;
        self.values.get(index)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        let index = self.position(key).ok()?;
        self.values.get_mut(index)
    }

    pub fn get_key_value(&self, key: &str) -> Option<(&Name, &V)> {
        let index = self.position(key).ok()?;
        Some((self.names().get(index)?, self.values.get(index)?))
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_ok()
    }

    /// Sets `key`'s value and returns the one it replaces; a replaced entry keeps its name.
    pub fn insert(&mut self, key: impl Into<Name>, value: V) -> Option<V> {
        let key = key.into();
        match self.position(&key) {
            Ok(index) => Some(std::mem::replace(&mut self.values[index], value)),
            Err(index) => {
                self.insert_at(index, key, value);
                None
            }
        }
    }

    /// Adds a name that is not there at its place in order.
    fn insert_at(&mut self, index: usize, key: Name, value: V) {
        let mut names = self.names().to_vec();
        names.insert(index, key);
        let mut values = std::mem::take(&mut self.values).into_vec();
        values.insert(index, value);
        self.names = Some(names.into());
        self.values = values.into_boxed_slice();
    }

    pub fn remove(&mut self, key: &str) -> Option<V> {
        let index = self.position(key).ok()?;
        let mut names = self.names().to_vec();
        names.remove(index);
        let mut values = std::mem::take(&mut self.values).into_vec();
        let removed = values.remove(index);
        self.names = (!names.is_empty()).then(|| names.into());
        self.values = values.into_boxed_slice();
        Some(removed)
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&Name, &mut V) -> bool) {
        let entries: Vec<(Name, V)> = std::mem::take(self)
            .into_iter()
            .filter_map(|(name, mut value)| keep(&name, &mut value).then_some((name, value)))
            .collect();
        *self = Self::from_sorted(entries);
    }

    pub fn entry(&mut self, key: impl Into<Name>) -> Entry<'_, V> {
        let key = key.into();
        match self.position(&key) {
            Ok(index) => Entry::Occupied(OccupiedEntry { map: self, index }),
            Err(index) => Entry::Vacant(VacantEntry {
                map: self,
                index,
                key,
            }),
        }
    }

    pub fn first_key_value(&self) -> Option<(&Name, &V)> {
        Some((self.names().first()?, self.values.first()?))
    }

    pub fn last_key_value(&self) -> Option<(&Name, &V)> {
        Some((self.names().last()?, self.values.last()?))
    }

    pub fn iter(&self) -> Iter<'_, V> {
        self.names().iter().zip(self.values.iter())
    }

    pub fn iter_mut(&mut self) -> IterMut<'_, V> {
        let names = self.names.as_deref().unwrap_or(&[]);
        names.iter().zip(self.values.iter_mut())
    }

    pub fn keys(&self) -> std::slice::Iter<'_, Name> {
        self.names().iter()
    }

    pub fn values(&self) -> std::slice::Iter<'_, V> {
        self.values.iter()
    }

    pub fn values_mut(&mut self) -> std::slice::IterMut<'_, V> {
        self.values.iter_mut()
    }

    pub fn into_keys(self) -> impl DoubleEndedIterator<Item = Name> + ExactSizeIterator {
        self.into_iter().map(|(name, _)| name)
    }

    pub fn into_values(self) -> std::vec::IntoIter<V> {
        self.values.into_vec().into_iter()
    }

    /// Entries sorted by name with no name twice.
    fn from_sorted(entries: Vec<(Name, V)>) -> Self {
        if entries.is_empty() {
            return Self::new();
        }
        let (names, values): (Vec<Name>, Vec<V>) = entries.into_iter().unzip();
        Self {
            names: Some(names.into()),
            values: values.into_boxed_slice(),
        }
    }

    /// Sorts `entries` by name, keeping the last value of a name given twice (as collecting
    /// into a `BTreeMap` does). Entries already in order are only checked.
    fn from_entries(mut entries: Vec<(Name, V)>) -> Self {
        let sorted = entries
            .windows(2)
            .all(|pair| pair[0].0.as_str() < pair[1].0.as_str());
        if !sorted {
            // Stable: of equal names, the later entry stays later and wins below.
            entries.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
            let mut deduplicated: Vec<(Name, V)> = Vec::with_capacity(entries.len());
            for (name, value) in entries {
                match deduplicated.last_mut() {
                    Some(last) if last.0 == name => last.1 = value,
                    _ => deduplicated.push((name, value)),
                }
            }
            entries = deduplicated;
        }
        Self::from_sorted(entries)
    }
}

/// [`NamedMap::iter`]'s iterator.
pub type Iter<'a, V> = std::iter::Zip<std::slice::Iter<'a, Name>, std::slice::Iter<'a, V>>;

/// [`NamedMap::iter_mut`]'s iterator.
pub type IterMut<'a, V> = std::iter::Zip<std::slice::Iter<'a, Name>, std::slice::IterMut<'a, V>>;

/// [`NamedMap`]'s owning iterator: each value with its name (a shared pointer, cloned).
pub struct IntoIter<V> {
    names: Option<Arc<[Name]>>,
    /// The name of the next value from the front.
    front: usize,
    values: std::vec::IntoIter<V>,
}

impl<V> IntoIter<V> {
    fn name(&self, index: usize) -> Name {
        match self.names.as_deref().and_then(|names| names.get(index)) {
            Some(name) => name.clone(),
            // Never: a map has a name per value.
            None => Name::new(""),
        }
    }
}

impl<V> Iterator for IntoIter<V> {
    type Item = (Name, V);

    fn next(&mut self) -> Option<(Name, V)> {
        let value = self.values.next()?;
        let name = self.name(self.front);
        self.front += 1;
        Some((name, value))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.values.size_hint()
    }
}

impl<V> DoubleEndedIterator for IntoIter<V> {
    fn next_back(&mut self) -> Option<(Name, V)> {
        let value = self.values.next_back()?;
        // What is left runs from `front` to `front + len`; the value taken was just past it.
        Some((self.name(self.front + self.values.len()), value))
    }
}

impl<V> ExactSizeIterator for IntoIter<V> {}

/// [`NamedMap::entry`]: a name's place in a map, filled or not.
pub enum Entry<'a, V> {
    Occupied(OccupiedEntry<'a, V>),
    Vacant(VacantEntry<'a, V>),
}

pub struct OccupiedEntry<'a, V> {
    map: &'a mut NamedMap<V>,
    index: usize,
}

pub struct VacantEntry<'a, V> {
    map: &'a mut NamedMap<V>,
    index: usize,
    key: Name,
}

impl<'a, V> Entry<'a, V> {
    pub fn or_insert(self, default: V) -> &'a mut V {
        self.or_insert_with(|| default)
    }

    pub fn or_insert_with(self, default: impl FnOnce() -> V) -> &'a mut V {
        match self {
            Self::Occupied(entry) => &mut entry.map.values[entry.index],
            Self::Vacant(entry) => {
                entry.map.insert_at(entry.index, entry.key, default());
                &mut entry.map.values[entry.index]
            }
        }
    }

    pub fn or_default(self) -> &'a mut V
    where
        V: Default,
    {
        self.or_insert_with(V::default)
    }

    pub fn and_modify(mut self, modify: impl FnOnce(&mut V)) -> Self {
        if let Self::Occupied(entry) = &mut self {
            modify(&mut entry.map.values[entry.index]);
        }
        self
    }

    pub fn key(&self) -> &Name {
        match self {
            Self::Occupied(entry) => &entry.map.names()[entry.index],
            Self::Vacant(entry) => &entry.key,
        }
    }
}

impl<V: fmt::Debug> fmt::Debug for NamedMap<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: Into<Name>, V> FromIterator<(K, V)> for NamedMap<V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self::from_entries(
            iter.into_iter()
                .map(|(key, value)| (key.into(), value))
                .collect(),
        )
    }
}

impl<K: Into<Name>, V, const N: usize> From<[(K, V); N]> for NamedMap<V> {
    fn from(entries: [(K, V); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl<K: Into<Name>, V> Extend<(K, V)> for NamedMap<V> {
    /// All at once: inserting one by one would copy the names per new name.
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, iter: I) {
        let mut entries: Vec<(Name, V)> = std::mem::take(self).into_iter().collect();
        entries.extend(iter.into_iter().map(|(key, value)| (key.into(), value)));
        *self = Self::from_entries(entries);
    }
}

impl<V> IntoIterator for NamedMap<V> {
    type Item = (Name, V);
    type IntoIter = IntoIter<V>;

    fn into_iter(self) -> Self::IntoIter {
        IntoIter {
            names: self.names,
            front: 0,
            values: self.values.into_vec().into_iter(),
        }
    }
}

impl<'a, V> IntoIterator for &'a NamedMap<V> {
    type Item = (&'a Name, &'a V);
    type IntoIter = Iter<'a, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'a, V> IntoIterator for &'a mut NamedMap<V> {
    type Item = (&'a Name, &'a mut V);
    type IntoIter = IterMut<'a, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
    }
}

/// `map["name"]`, which panics where the name is absent, as `BTreeMap`'s does: for names the
/// code itself put there.
impl<V> Index<&str> for NamedMap<V> {
    type Output = V;

    fn index(&self, key: &str) -> &V {
        match self.get(key) {
            Some(value) => value,
            None => panic!("no entry named {key:?}"),
        }
    }
}

impl<V> Index<&String> for NamedMap<V> {
    type Output = V;

    fn index(&self, key: &String) -> &V {
        &self[key.as_str()]
    }
}

impl<V> Index<&Name> for NamedMap<V> {
    type Output = V;

    fn index(&self, key: &Name) -> &V {
        &self[key.as_str()]
    }
}

impl<V> IndexMut<&str> for NamedMap<V> {
    fn index_mut(&mut self, key: &str) -> &mut V {
        match self.get_mut(key) {
            Some(value) => value,
            None => panic!("no entry named {key:?}"),
        }
    }
}

impl<V: Serialize> Serialize for NamedMap<V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.len()))?;
        for (name, value) in self {
            map.serialize_entry(name.as_str(), value)?;
        }
        map.end()
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for NamedMap<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor<V>(std::marker::PhantomData<V>);

        impl<'de, V: Deserialize<'de>> Visitor<'de> for MapVisitor<V> {
            type Value = NamedMap<V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of names to values")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                // The size hint comes from the input: capped, so a hostile file cannot make
                // one allocation of its choosing.
                let capacity = access.size_hint().unwrap_or(0).min(64);
                let mut entries = Vec::with_capacity(capacity);
                while let Some((name, value)) = access.next_entry::<String, V>()? {
                    entries.push((Name::from(name), value));
                }
                Ok(NamedMap::from_entries(entries))
            }
        }

        deserializer.deserialize_map(MapVisitor(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const NAMES: [&str; 9] = [
        "slots",
        "topdown-retiring",
        "cpu-clock",
        "INT_MISC.UOP_DROPPING",
        "topdown-be-bound",
        "a",
        "Z",
        "topdown-bad-spec",
        "group1.enabled_ns",
    ];

    fn both() -> (NamedMap<u64>, BTreeMap<String, u64>) {
        let pairs = NAMES.iter().enumerate().map(|(i, name)| (*name, i as u64));
        (
            pairs.clone().collect(),
            pairs.map(|(name, i)| (name.to_owned(), i)).collect(),
        )
    }

    #[test]
    fn iterates_in_the_order_btreemap_does() {
        let (named, tree) = both();
        let named: Vec<(&str, u64)> = named.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let tree: Vec<(&str, u64)> = tree.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(named, tree);
    }

    #[test]
    fn a_name_given_twice_keeps_its_last_value_as_btreemap_does() {
        let pairs = [("b", 1), ("a", 2), ("b", 3), ("a", 4), ("c", 5)];
        let named: NamedMap<u64> = pairs.into_iter().collect();
        let tree: BTreeMap<&str, u64> = pairs.into_iter().collect();
        assert_eq!(
            named
                .iter()
                .map(|(k, v)| (k.as_str(), *v))
                .collect::<Vec<_>>(),
            tree.into_iter().collect::<Vec<_>>()
        );
    }

    #[test]
    fn insert_adds_in_order_and_replaces() {
        let mut named = NamedMap::new();
        assert_eq!(named.insert("m", 1), None);
        assert_eq!(named.insert("b", 2), None);
        assert_eq!(named.insert("z", 3), None);
        assert_eq!(named.insert("m".to_owned(), 4), Some(1));
        assert_eq!(named.len(), 3);
        assert_eq!(
            named.keys().map(Name::as_str).collect::<Vec<_>>(),
            ["b", "m", "z"]
        );
        assert_eq!(named.get("m"), Some(&4));
        assert_eq!(named["z"], 3);
        assert!(named.contains_key("b"));
        assert!(!named.contains_key("c"));
        assert_eq!(named.remove("b"), Some(2));
        assert_eq!(named.remove("b"), None);
        *named.get_mut("z").unwrap() += 1;
        *named.entry("a").or_insert(0) += 10;
        *named.entry("a").or_insert(0) += 10;
        assert_eq!(
            named
                .iter()
                .map(|(k, v)| (k.as_str(), *v))
                .collect::<Vec<_>>(),
            [("a", 20), ("m", 4), ("z", 4)]
        );
        named.extend([("y", 7), ("a", 1)]);
        assert_eq!(named.values().copied().collect::<Vec<_>>(), [1, 4, 7, 4]);
    }

    #[test]
    fn clones_share_their_names_until_one_adds_a_name() {
        let table: Vec<Name> = NAMES.iter().map(|name| Name::from(*name)).collect();
        let template: NamedMap<u64> = table.iter().map(|name| (name, 0)).collect();
        let mut one = template.clone();
        for (value, at) in one.values_mut().zip(1..) {
            *value = at;
        }
        assert!(std::ptr::eq(
            template.keys().as_slice(),
            one.keys().as_slice()
        ));
        for name in one.keys() {
            assert!(
                table
                    .iter()
                    .any(|kept| std::ptr::eq(name.as_str(), kept.as_str()))
            );
        }
        one.insert("new", 0);
        assert!(!std::ptr::eq(
            template.keys().as_slice(),
            one.keys().as_slice()
        ));
        assert_eq!(template.len(), NAMES.len());
        assert!(template.values().all(|value| *value == 0));
    }

    #[test]
    fn removes_retains_and_iterates_owned_from_both_ends() {
        let (mut named, mut tree) = both();
        assert_eq!(named.remove("slots"), tree.remove("slots"));
        named.retain(|_, value| *value % 2 == 0);
        tree.retain(|_, value| *value % 2 == 0);
        let owned: Vec<(String, u64)> = named
            .clone()
            .into_iter()
            .map(|(k, v)| (k.into(), v))
            .collect();
        assert_eq!(owned, tree.clone().into_iter().collect::<Vec<_>>());
        let backwards: Vec<(String, u64)> = named
            .clone()
            .into_iter()
            .rev()
            .map(|(k, v)| (k.into(), v))
            .collect();
        assert_eq!(
            backwards,
            tree.clone().into_iter().rev().collect::<Vec<_>>()
        );
        let mut ends = named.clone().into_iter();
        let first = ends.next().map(|(k, v)| (String::from(k), v));
        let last = ends.next_back().map(|(k, v)| (String::from(k), v));
        assert_eq!(first, tree.first_key_value().map(|(k, v)| (k.clone(), *v)));
        assert_eq!(last, tree.last_key_value().map(|(k, v)| (k.clone(), *v)));
        named.retain(|_, _| false);
        assert!(named.is_empty());
        assert_eq!(named, NamedMap::new());
    }

    #[test]
    fn serializes_as_btreemap_does_and_reads_back() {
        let (named, tree) = both();
        let json = serde_json::to_string(&named).unwrap();
        assert_eq!(json, serde_json::to_string(&tree).unwrap());
        assert_eq!(
            serde_json::to_string_pretty(&named).unwrap(),
            serde_json::to_string_pretty(&tree).unwrap()
        );
        let back: NamedMap<u64> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, named);

        let metrics: NamedMap<Option<f64>> =
            [("retiring", Some(0.25)), ("bad_speculation", None)].into();
        let json = serde_json::to_string(&metrics).unwrap();
        assert_eq!(json, r#"{"bad_speculation":null,"retiring":0.25}"#);
        let back: NamedMap<Option<f64>> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, metrics);
    }

    #[test]
    fn reads_an_unsorted_map_with_a_repeated_name_as_btreemap_does() {
        let json = r#"{"b":1,"a":2,"b":3}"#;
        let named: NamedMap<u64> = serde_json::from_str(json).unwrap();
        let tree: BTreeMap<String, u64> = serde_json::from_str(json).unwrap();
        assert_eq!(
            serde_json::to_string(&named).unwrap(),
            serde_json::to_string(&tree).unwrap()
        );
    }

    #[test]
    fn empty_maps_compare_equal_and_serialize_empty() {
        let named: NamedMap<f64> = NamedMap::default();
        assert!(named.is_empty());
        assert_eq!(named, NamedMap::new());
        assert_eq!(serde_json::to_string(&named).unwrap(), "{}");
    }
}
