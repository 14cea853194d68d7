//! The text index of `list_sensors`' `text` filter: which sensors hold a word.
//!
//! A sensor matches a word when one of its fields (ID, description, equipment, unit, kind;
//! lowercase) contains the word. A word has no whitespace, so it lies within one
//! whitespace-separated token of a field: the index keeps every distinct token once (the
//! vocabulary, in one string) and, per token, the sensors that have it. A query finds the
//! tokens containing each word by one search through the vocabulary, unites their sensors
//! and intersects across words: the same answer as testing every sensor, without touching
//! each. Built on first use, once per registry.

use super::Sensor;

/// The tokens of every sensor and, per token, the sensors that have it.
#[derive(Debug)]
pub struct TextIndex {
    /// Every distinct token, lowercase, each followed by `\n` (which no token holds).
    vocabulary: String,
    /// Where each token starts in `vocabulary`, ascending.
    starts: Vec<u32>,
    /// Token `t`'s sensors are `sensors[offsets[t]..offsets[t + 1]]`, ascending.
    offsets: Vec<u32>,
    sensors: Vec<u32>,
    /// How many sensors the registry has (the size of a match set).
    len: usize,
}

/// The sensors matching a query: one bit per sensor, by place in the registry.
pub struct Matches(Vec<u64>);

impl Matches {
    pub fn contains(&self, sensor: usize) -> bool {
        self.0.get(sensor / 64).is_some_and(|w| w >> (sensor % 64) & 1 == 1)
    }

    /// The matching places, ascending.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let bit = w.trailing_zeros() as usize;
                w &= w - 1;
                Some(i * 64 + bit)
            })
        })
    }
}

/// A sensor's searchable text: its fields, lowercase, separated by spaces.
pub fn haystack(s: &Sensor) -> String {
    format!(
        "{} {} {} {} {}",
        s.id.as_str(),
        s.description,
        s.equipment.as_deref().unwrap_or(""),
        s.unit,
        s.kind
    )
    .to_lowercase()
}

impl TextIndex {
    pub fn build(sensors: &[Sensor]) -> TextIndex {
        let hays: Vec<String> = sensors.iter().map(haystack).collect();
        // Each token's sensors, ascending (sensors are visited in order).
        let mut by_token: foldhash::HashMap<&str, Vec<u32>> = foldhash::HashMap::default();
        for (i, hay) in hays.iter().enumerate() {
            for token in hay.split_whitespace() {
                let list = by_token.entry(token).or_default();
                if list.last() != Some(&(i as u32)) {
                    list.push(i as u32);
                }
            }
        }
        let mut tokens: Vec<(&str, Vec<u32>)> = by_token.into_iter().collect();
        tokens.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut index = TextIndex {
            vocabulary: String::with_capacity(tokens.iter().map(|(t, _)| t.len() + 1).sum()),
            starts: Vec::with_capacity(tokens.len()),
            offsets: Vec::with_capacity(tokens.len() + 1),
            sensors: Vec::with_capacity(tokens.iter().map(|(_, s)| s.len()).sum()),
            len: sensors.len(),
        };
        for (token, list) in tokens {
            index.starts.push(index.vocabulary.len() as u32);
            index.offsets.push(index.sensors.len() as u32);
            index.vocabulary.push_str(token);
            index.vocabulary.push('\n');
            index.sensors.extend(list);
        }
        index.offsets.push(index.sensors.len() as u32);
        index
    }

    /// The sensors whose text contains every word (lowercase, without whitespace).
    pub fn matching(&self, words: &[String]) -> Matches {
        let blocks = self.len.div_ceil(64);
        let mut all: Option<Vec<u64>> = None;
        for word in words {
            let mut set = vec![0u64; blocks];
            let mut previous = None;
            // A word with a line break would match across tokens: no token holds one.
            let found = (!word.contains('\n')).then(|| self.vocabulary.match_indices(word.as_str()));
            for (at, _) in found.into_iter().flatten() {
                // Every match starts in a token (the vocabulary starts with one).
                let Some(token) = self.starts.partition_point(|&s| s as usize <= at).checked_sub(1) else {
                    continue;
                };
                if previous == Some(token) {
                    continue;
                }
                previous = Some(token);
                let (from, to) = (self.offsets[token] as usize, self.offsets[token + 1] as usize);
                for &s in &self.sensors[from..to] {
                    set[s as usize / 64] |= 1 << (s % 64);
                }
            }
            all = Some(match all {
                None => set,
                Some(mut a) => {
                    a.iter_mut().zip(&set).for_each(|(a, b)| *a &= b);
                    a
                }
            });
        }
        Matches(all.unwrap_or_else(|| {
            let mut every = vec![u64::MAX; blocks];
            if let Some(last) = every.last_mut()
                && !self.len.is_multiple_of(64)
            {
                *last = (1 << (self.len % 64)) - 1;
            }
            every
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::Registry;
    use super::*;

    fn registry() -> Registry {
        let file = |dev: &str, zone: &str, sensors: &[(&str, &str, &str)]| {
            let mut t = format!(
                "id = \"{dev}\"\nplant = \"A\"\nzone = \"{zone}\"\ndescription = \"d\"\nprotocol = \"modbus-tcp\"\nendpoint = \"127.0.0.1:1\"\n"
            );
            for (i, (id, description, equipment)) in sensors.iter().enumerate() {
                t.push_str(&format!(
                    "\n[[sensors]]\nid = \"{id}\"\ndescription = \"{description}\"\nkind = \"pressure\"\nunit = \"bar\"\nequipment = \"{equipment}\"\ntable = \"holding\"\naddress = {i}\ntype = \"u16\"\n"
                ));
            }
            (format!("{dev}.toml"), t)
        };
        Registry::from_texts(&[
            file(
                "pump-1",
                "LINE1",
                &[
                    ("A_LINE1_001", "Pump 1 discharge pressure", "P-101"),
                    ("A_LINE1_002", "Pump 1 suction pressure", "P-101"),
                ],
            ),
            file("boiler-2", "LINE2", &[("A_LINE2_001", "Boiler drum pressure", "B-201")]),
        ])
        .unwrap()
    }

    /// What a scan of every sensor answers: the reference the index must agree with.
    fn scan(r: &Registry, words: &[String]) -> Vec<usize> {
        let hays: Vec<String> = r.sensors().iter().map(haystack).collect();
        (0..hays.len()).filter(|&i| words.iter().all(|w| hays[i].contains(w.as_str()))).collect()
    }

    #[test]
    fn the_index_answers_as_a_scan_of_every_sensor() {
        let r = registry();
        let index = TextIndex::build(r.sensors());
        for query in [
            "pump",
            "pressure",
            "p-101",
            "1 pres",
            "line1_00",
            "a_line2_001",
            "ump",
            "e",
            "bar pressure",
            "discharge suction",
            "nothing",
            "\u{130}",
            "101 p-1",
        ] {
            let words: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
            let got: Vec<usize> = index.matching(&words).iter().collect();
            assert_eq!(got, scan(&r, &words), "{query}");
        }
    }

    #[test]
    fn a_word_never_matches_across_two_tokens() {
        let r = registry();
        let index = TextIndex::build(r.sensors());
        // "pump" then "1": together only with the space between them.
        assert!(index.matching(&["pump1".to_string()]).iter().next().is_none());
        assert!(index.matching(&["001\npump".to_string()]).iter().next().is_none());
    }

    #[test]
    fn an_empty_word_matches_as_a_scan_does_and_an_empty_registry_nothing() {
        let r = registry();
        let all: Vec<usize> = TextIndex::build(r.sensors()).matching(&[String::new()]).iter().collect();
        assert_eq!(all, vec![0, 1, 2]);
        let none = TextIndex::build(&[]).matching(&[String::new(), "x".into()]);
        assert!(none.iter().next().is_none());
    }

    #[test]
    fn no_words_match_every_sensor_and_places_past_the_end_none() {
        let r = registry();
        let m = TextIndex::build(r.sensors()).matching(&[]);
        assert_eq!(m.iter().collect::<Vec<_>>(), vec![0, 1, 2]);
        assert!(m.contains(2) && !m.contains(64) && !m.contains(10_000));
    }
}
