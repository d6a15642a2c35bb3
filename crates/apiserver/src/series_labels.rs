//! A label set, packed: every name and value in one string and where each ends in one slice,
//! two allocations however many labels there are, read from a JSON object of strings (a time
//! series' labels in a metrics backend's answer) without a string per label.
//!
//! An answer for 10,000 pods has 10,000 series; as a `HashMap<String, String>` each cost a
//! table and two strings per label (five or six small allocations for two labels), all
//! short-lived, a burst of 100,000 small blocks per query among the allocator's longer-lived
//! ones. A series has a handful of labels, so a lookup is a scan of them.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};

/// A series' labels, sorted by name, each name once.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct SeriesLabels {
    /// Name, value, name, value… one after the other.
    text: Box<str>,
    /// Where each name and each value ends in `text`: label `i`'s name ends at `ends[2 i]`,
    /// its value at `ends[2 i + 1]`.
    ends: Box<[u32]>,
}

impl SeriesLabels {
    /// The value of label `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.iter().find_map(|(n, value)| (n == name).then_some(value))
    }

    /// Whether label `name` is set.
    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Every label, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        let text: &str = &self.text;
        let mut start = 0;
        self.ends.chunks_exact(2).map(move |ends| {
            let (name_end, value_end) = (ends[0] as usize, ends[1] as usize);
            let name = text.get(start..name_end).unwrap_or_default();
            let value = text.get(name_end..value_end).unwrap_or_default();
            start = value_end;
            (name, value)
        })
    }

    /// How many labels.
    pub fn len(&self) -> usize {
        self.ends.len() / 2
    }

    /// Whether there are none (a scalar, or a vector sample summed over everything).
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// These labels with `name` set to `value`.
    pub fn with(&self, name: &str, value: &str) -> Self {
        let others = self.iter().filter(|(n, _)| *n != name);
        Self::from_iter(others.chain(std::iter::once((name, value))))
    }

    /// Packs labels already sorted by name, each name once.
    fn pack<'a>(labels: impl Iterator<Item = (&'a str, &'a str)> + Clone) -> Self {
        let bytes: usize = labels.clone().map(|(n, v)| n.len() + v.len()).sum();
        let mut text = String::with_capacity(bytes);
        let mut ends = Vec::with_capacity(labels.clone().count() * 2);
        for (name, value) in labels {
            text.push_str(name);
            ends.push(end(&text));
            text.push_str(value);
            ends.push(end(&text));
        }
        Self { text: text.into_boxed_str(), ends: ends.into_boxed_slice() }
    }
}

/// The end of `text` as an offset (labels are never 4 GiB: the answer's size is bounded).
fn end(text: &str) -> u32 {
    u32::try_from(text.len()).unwrap_or(u32::MAX)
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for SeriesLabels {
    /// Sorted by name; of a name given twice, the last value.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(labels: I) -> Self {
        let mut labels: Vec<(K, V)> = labels.into_iter().collect();
        // Stable: of equal names the last given comes last, and is the one kept.
        labels.sort_by(|(a, _), (b, _)| a.as_ref().cmp(b.as_ref()));
        let mut kept: Vec<(&str, &str)> = Vec::with_capacity(labels.len());
        for (name, value) in &labels {
            match kept.last_mut() {
                Some(last) if last.0 == name.as_ref() => last.1 = value.as_ref(),
                _ => kept.push((name.as_ref(), value.as_ref())),
            }
        }
        Self::pack(kept.iter().copied())
    }
}

impl fmt::Debug for SeriesLabels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// A JSON string, borrowed from the answer unless it has escapes.
pub struct JsonStr<'de>(pub Cow<'de, str>);

impl<'de: 'a, 'a> Deserialize<'de> for JsonStr<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for StrVisitor<'a> {
            type Value = JsonStr<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(JsonStr(Cow::Borrowed(s)))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(JsonStr(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, s: String) -> Result<Self::Value, E> {
                Ok(JsonStr(Cow::Owned(s)))
            }
        }
        deserializer.deserialize_str(StrVisitor(std::marker::PhantomData))
    }
}

impl<'de> Deserialize<'de> for SeriesLabels {
    /// A JSON object of strings, packed without a string per label.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LabelsVisitor;
        impl<'de> Visitor<'de> for LabelsVisitor {
            type Value = SeriesLabels;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of label names to values")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                // Backends send a series' labels sorted by name; packed as they come then,
                // else sorted first.
                let mut labels: Vec<(JsonStr<'de>, JsonStr<'de>)> =
                    Vec::with_capacity(map.size_hint().unwrap_or(4).min(32));
                while let Some(entry) = map.next_entry::<JsonStr<'de>, JsonStr<'de>>()? {
                    labels.push(entry);
                }
                let pairs = labels.iter().map(|(n, v)| (&*n.0, &*v.0));
                let sorted = labels.windows(2).all(|w| w[0].0.0 < w[1].0.0);
                Ok(if sorted { SeriesLabels::pack(pairs) } else { pairs.collect() })
            }
        }
        deserializer.deserialize_map(LabelsVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(json: &str) -> SeriesLabels {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn reads_labels_by_name_and_in_order() {
        let l = labels(r#"{"namespace":"shop","pod":"web-1","__name__":"up"}"#);
        assert_eq!(l.get("pod"), Some("web-1"));
        assert_eq!(l.get("namespace"), Some("shop"));
        assert_eq!(l.get("__name__"), Some("up"));
        assert_eq!(l.get("po"), None);
        assert_eq!(l.get("web-1"), None, "a value is not a name");
        assert_eq!(l.len(), 3);
        assert_eq!(
            l.iter().collect::<Vec<_>>(),
            [("__name__", "up"), ("namespace", "shop"), ("pod", "web-1")],
            "sorted by name whatever the answer's order"
        );
        assert_eq!(l, labels(r#"{"__name__":"up","namespace":"shop","pod":"web-1"}"#));
    }

    #[test]
    fn escapes_empty_values_and_non_ascii_survive() {
        let l = labels(r#"{"a":"","b":"x\"y\\z\n","é":"ü→\u00e9","c":"a=b,c"}"#);
        assert_eq!(l.get("a"), Some(""));
        assert_eq!(l.get("b"), Some("x\"y\\z\n"));
        assert_eq!(l.get("é"), Some("ü→é"));
        assert_eq!(l.get("c"), Some("a=b,c"));
        assert!(l.contains_key("a") && !l.contains_key(""));
    }

    #[test]
    fn no_labels() {
        let l = labels("{}");
        assert!(l.is_empty());
        assert_eq!(l.iter().count(), 0);
        assert_eq!(l, SeriesLabels::default());
        assert_eq!(l.get(""), None);
    }

    #[test]
    fn a_name_given_twice_keeps_the_last_value() {
        let l: SeriesLabels = [("b", "1"), ("a", "2"), ("b", "3")].into_iter().collect();
        assert_eq!(l.iter().collect::<Vec<_>>(), [("a", "2"), ("b", "3")]);
        let l = labels(r#"{"b":"1","a":"2","b":"3"}"#);
        assert_eq!(l.get("b"), Some("3"));
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn with_sets_or_replaces_one_label() {
        let l = labels(r#"{"cafe":"espresso","namespace":"shop"}"#);
        let typed = l.with("type", "latte");
        assert_eq!(
            typed.iter().collect::<Vec<_>>(),
            [("cafe", "espresso"), ("namespace", "shop"), ("type", "latte")]
        );
        assert_eq!(typed.with("type", "mocha").get("type"), Some("mocha"));
        assert_eq!(l.len(), 2, "the original is unchanged");
    }

    #[test]
    fn anything_but_a_map_of_strings_is_an_error() {
        for bad in [r#"{"a":1}"#, r#"["a","b"]"#, r#""a""#, r#"{"a":null}"#, r#"{"a":{"b":"c"}}"#] {
            let error = serde_json::from_str::<SeriesLabels>(bad).unwrap_err().to_string();
            assert!(error.contains("expected"), "{bad}: {error}");
        }
    }

    #[test]
    fn debug_prints_a_map() {
        let l = labels(r#"{"pod":"web-1","namespace":"shop"}"#);
        assert_eq!(format!("{l:?}"), r#"{"namespace": "shop", "pod": "web-1"}"#);
    }
}
