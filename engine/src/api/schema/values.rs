//! Field value types of the request bodies: each says in its `expecting` what a person
//! should send, so that a type error reads `` `sampling_params.n`: invalid type: string "2",
//! expected a non-negative integer ``. Lists whose shape is decided by their first element
//! (`prompt`, `input_ids`) read the rest with that element's type, so an array is walked once
//! and never held twice.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Unexpected, Visitor};
use serde_json::{Map, Value};

/// A JSON number, integer or not.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Number(pub f64);

/// An integer >= 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count(pub usize);

/// An integer of either sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int(pub i64);

/// A seed: any integer; a negative one keeps its bits (OpenAI clients send them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seed(pub u64);

/// A token id: an integer in `0..2^32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenId(pub u32);

/// A list of token ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenIds(pub Vec<u32>);

/// A string or a list of strings (OpenAI's `stop`); empty strings are dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopStrings(pub Vec<String>);

/// `logit_bias`: `{"<token id>": bias}`, keys as sent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogitBias(pub Vec<(String, Number)>);

/// A JSON object of any fields (`chat_template_kwargs`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Object(pub Map<String, Value>);

/// A JSON list of any values (a message's `tool_calls`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct List(pub Vec<Value>);

/// One value for every prompt, or (in a batch) a list with one value per prompt.
#[derive(Debug, Clone, PartialEq)]
pub enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

/// `/generate`'s `input_ids`: one prompt's token ids, or a list of such lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputIds {
    One(Vec<u32>),
    Batch(Vec<Vec<u32>>),
}

/// `/v1/completions`' `prompt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompletionPrompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    Batch(Vec<Vec<u32>>),
}

/// Most elements reserved ahead from a list's announced length.
const MAX_RESERVE: usize = 4096;

fn reserve<'de, A: SeqAccess<'de>, T>(seq: &A) -> Vec<T> {
    Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX_RESERVE))
}

/// `first`, then every further element of `seq` read as a `T`.
fn rest_of<'de, A: SeqAccess<'de>, T: Deserialize<'de>>(
    first: T,
    mut seq: A,
) -> Result<Vec<T>, A::Error> {
    let mut out = reserve(&seq);
    out.push(first);
    while let Some(x) = seq.next_element()? {
        out.push(x);
    }
    Ok(out)
}

fn unwrap_ids(ids: Vec<TokenId>) -> Vec<u32> {
    ids.into_iter().map(|t| t.0).collect()
}

/// A visitor whose `expecting` is a fixed text; `visit` holds the accepting methods.
macro_rules! visitor {
    ($name:ident => $out:ty, $expecting:literal, { $($visit:item)* }) => {
        struct $name;
        impl<'de> Visitor<'de> for $name {
            type Value = $out;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str($expecting)
            }
            $($visit)*
        }
    };
}

visitor!(NumberVisitor => Number, "a number", {
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Number, E> { Ok(Number(v)) }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Number, E> { Ok(Number(v as f64)) }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Number, E> { Ok(Number(v as f64)) }
});

visitor!(CountVisitor => Count, "a non-negative integer", {
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Count, E> {
        usize::try_from(v).map(Count).map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Count, E> {
        usize::try_from(v).map(Count).map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
    }
});

visitor!(IntVisitor => Int, "an integer", {
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Int, E> { Ok(Int(v)) }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Int, E> {
        i64::try_from(v).map(Int).map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
    }
});

visitor!(SeedVisitor => Seed, "an integer", {
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Seed, E> { Ok(Seed(v)) }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Seed, E> { Ok(Seed(v as u64)) }
});

visitor!(TokenIdVisitor => TokenId, "a token id (an integer >= 0)", {
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<TokenId, E> {
        u32::try_from(v).map(TokenId).map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<TokenId, E> {
        u32::try_from(v).map(TokenId).map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
    }
});

visitor!(TokenIdsVisitor => TokenIds, "a list of token ids", {
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TokenIds, A::Error> {
        let mut out = reserve(&seq);
        while let Some(TokenId(id)) = seq.next_element()? {
            out.push(id);
        }
        Ok(TokenIds(out))
    }
});

visitor!(StopVisitor => StopStrings, "a string or a list of strings", {
    fn visit_str<E: de::Error>(self, v: &str) -> Result<StopStrings, E> {
        Ok(StopStrings(if v.is_empty() { Vec::new() } else { vec![v.to_string()] }))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StopStrings, A::Error> {
        let mut out = reserve(&seq);
        while let Some(s) = seq.next_element::<String>()? {
            if !s.is_empty() {
                out.push(s);
            }
        }
        Ok(StopStrings(out))
    }
});

visitor!(LogitBiasVisitor => LogitBias, "an object mapping token ids to biases", {
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LogitBias, A::Error> {
        let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0).min(MAX_RESERVE));
        while let Some(entry) = map.next_entry::<String, Number>()? {
            out.push(entry);
        }
        Ok(LogitBias(out))
    }
});

visitor!(ObjectVisitor => Object, "an object", {
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Object, A::Error> {
        let mut out = Map::new();
        while let Some((k, v)) = map.next_entry::<String, Value>()? {
            out.insert(k, v);
        }
        Ok(Object(out))
    }
});

visitor!(ListVisitor => List, "a list", {
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<List, A::Error> {
        let mut out = reserve(&seq);
        while let Some(v) = seq.next_element()? {
            out.push(v);
        }
        Ok(List(out))
    }
});

/// The first element of a list whose elements may be token ids, strings or id lists.
enum PromptItem {
    Text(String),
    Id(u32),
    Ids(Vec<u32>),
}

visitor!(PromptItemVisitor => PromptItem, "a string, a token id or a list of token ids", {
    fn visit_str<E: de::Error>(self, v: &str) -> Result<PromptItem, E> { Ok(PromptItem::Text(v.to_string())) }
    fn visit_string<E: de::Error>(self, v: String) -> Result<PromptItem, E> { Ok(PromptItem::Text(v)) }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<PromptItem, E> { TokenIdVisitor.visit_u64(v).map(|t| PromptItem::Id(t.0)) }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<PromptItem, E> { TokenIdVisitor.visit_i64(v).map(|t| PromptItem::Id(t.0)) }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<PromptItem, A::Error> {
        TokenIdsVisitor.visit_seq(seq).map(|t| PromptItem::Ids(t.0))
    }
});

visitor!(InputIdsVisitor => InputIds, "a list of token ids or a list of token-id lists", {
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<InputIds, A::Error> {
        match seq.next_element::<IdOrIds>()? {
            None => Ok(InputIds::One(Vec::new())),
            Some(IdOrIds(PromptItem::Ids(first))) => {
                let rest = rest_of(TokenIds(first), seq)?;
                Ok(InputIds::Batch(rest.into_iter().map(|t| t.0).collect()))
            }
            Some(IdOrIds(PromptItem::Id(first))) => {
                Ok(InputIds::One(unwrap_ids(rest_of(TokenId(first), seq)?)))
            }
            Some(IdOrIds(PromptItem::Text(_))) => {
                Err(de::Error::invalid_type(Unexpected::Other("string"), &"a token id"))
            }
        }
    }
});

/// The first element of `input_ids`: a token id or a list of them (no text).
struct IdOrIds(PromptItem);

visitor!(IdOrIdsVisitor => IdOrIds, "a token id (an integer >= 0) or a list of token ids", {
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<IdOrIds, E> { PromptItemVisitor.visit_u64(v).map(IdOrIds) }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<IdOrIds, E> { PromptItemVisitor.visit_i64(v).map(IdOrIds) }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<IdOrIds, A::Error> {
        PromptItemVisitor.visit_seq(seq).map(IdOrIds)
    }
});

visitor!(CompletionPromptVisitor => CompletionPrompt,
    "a string, a list of strings, a list of token ids, or a list of token-id lists", {
    fn visit_str<E: de::Error>(self, v: &str) -> Result<CompletionPrompt, E> { Ok(CompletionPrompt::Text(v.to_string())) }
    fn visit_string<E: de::Error>(self, v: String) -> Result<CompletionPrompt, E> { Ok(CompletionPrompt::Text(v)) }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<CompletionPrompt, A::Error> {
        Ok(match seq.next_element::<PromptItem>()? {
            None => CompletionPrompt::Texts(Vec::new()),
            Some(PromptItem::Text(first)) => CompletionPrompt::Texts(rest_of(first, seq)?),
            Some(PromptItem::Id(first)) => CompletionPrompt::Ids(unwrap_ids(rest_of(TokenId(first), seq)?)),
            Some(PromptItem::Ids(first)) => {
                CompletionPrompt::Batch(rest_of(TokenIds(first), seq)?.into_iter().map(|t| t.0).collect())
            }
        })
    }
});

macro_rules! deserialize_with {
    ($($ty:ty => $method:ident($visitor:expr);)*) => {$(
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.$method($visitor)
            }
        }
    )*};
}

deserialize_with! {
    Number => deserialize_f64(NumberVisitor);
    Count => deserialize_u64(CountVisitor);
    Int => deserialize_i64(IntVisitor);
    Seed => deserialize_i64(SeedVisitor);
    TokenId => deserialize_u32(TokenIdVisitor);
    TokenIds => deserialize_seq(TokenIdsVisitor);
    StopStrings => deserialize_any(StopVisitor);
    LogitBias => deserialize_map(LogitBiasVisitor);
    Object => deserialize_map(ObjectVisitor);
    List => deserialize_seq(ListVisitor);
    PromptItem => deserialize_any(PromptItemVisitor);
    IdOrIds => deserialize_any(IdOrIdsVisitor);
    InputIds => deserialize_seq(InputIdsVisitor);
    CompletionPrompt => deserialize_any(CompletionPromptVisitor);
}

/// Reads a list as `Many`, anything else as one `T` (forwarded to `T`'s own deserializer, so
/// its error says what one value must be).
struct OneOrManyVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for OneOrManyVisitor<T> {
    type Value = OneOrMany<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a value, or a list with one value per prompt")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = reserve(&seq);
        while let Some(x) = seq.next_element()? {
            out.push(x);
        }
        Ok(OneOrMany::Many(out))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        T::deserialize(de::value::BoolDeserializer::new(v)).map(OneOrMany::One)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        T::deserialize(de::value::I64Deserializer::new(v)).map(OneOrMany::One)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        T::deserialize(de::value::U64Deserializer::new(v)).map(OneOrMany::One)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        T::deserialize(de::value::F64Deserializer::new(v)).map(OneOrMany::One)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        T::deserialize(de::value::StrDeserializer::new(v)).map(OneOrMany::One)
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        T::deserialize(de::value::StringDeserializer::new(v)).map(OneOrMany::One)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::deserialize(de::value::MapAccessDeserializer::new(map)).map(OneOrMany::One)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for OneOrMany<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(OneOrManyVisitor(PhantomData))
    }
}
