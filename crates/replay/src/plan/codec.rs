//! Serde helpers for the plan's fields: dtypes by name, floats that survive JSON (NaN and
//! infinities as strings), lists of them.

/// A dtype as its ET name (`float`, `c10::BFloat16`, ...): readable in a stored plan.
pub(super) mod dtype_name {
    use et_schema::DType;
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &DType, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(d.et_name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DType, D::Error> {
        let name = String::deserialize(d)?;
        DType::from_et_name(&name)
            .ok_or_else(|| D::Error::custom(format!("unknown dtype {name:?}")))
    }

    /// The same for an optional dtype.
    pub mod opt {
        use et_schema::DType;
        use serde::{Deserialize, Deserializer, Serializer};

        pub fn serialize<S: Serializer>(d: &Option<DType>, s: S) -> Result<S::Ok, S::Error> {
            match d {
                Some(d) => super::serialize(d, s),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DType>, D::Error> {
            match Option::<String>::deserialize(d)? {
                Some(name) => DType::from_et_name(&name)
                    .map(Some)
                    .ok_or_else(|| serde::de::Error::custom(format!("unknown dtype {name:?}"))),
                None => Ok(None),
            }
        }
    }
}

/// Doubles as JSON numbers, and the non-finite ones a trace can hold (`-inf` masks, `inf`
/// clamp bounds) as the strings `inf`, `-inf` and `nan`, which JSON numbers cannot express.
pub(super) mod float {
    use serde::{de::Error, Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    pub(super) enum Repr {
        Num(f64),
        Text(String),
    }

    pub(super) fn to_repr(v: f64) -> Repr {
        if v.is_finite() {
            Repr::Num(v)
        } else {
            Repr::Text(
                if v.is_nan() {
                    "nan"
                } else if v > 0.0 {
                    "inf"
                } else {
                    "-inf"
                }
                .into(),
            )
        }
    }

    pub(super) fn from_repr<E: Error>(r: Repr) -> Result<f64, E> {
        match r {
            Repr::Num(v) => Ok(v),
            Repr::Text(t) => match t.as_str() {
                "nan" => Ok(f64::NAN),
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                _ => Err(E::custom(format!("not a number: {t:?}"))),
            },
        }
    }

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        to_repr(*v).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        from_repr(Repr::deserialize(d)?)
    }
}

/// [`float`] for lists.
pub(super) mod floats {
    use super::float::{from_repr, to_repr, Repr};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &[f64], s: S) -> Result<S::Ok, S::Error> {
        v.iter()
            .map(|x| to_repr(*x))
            .collect::<Vec<_>>()
            .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        Vec::<Repr>::deserialize(d)?
            .into_iter()
            .map(from_repr)
            .collect()
    }
}
