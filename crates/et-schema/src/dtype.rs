//! Element types, in every spelling the ET observer has used across builds.

use std::fmt;

/// A tensor element type (c10::ScalarType); the variants are in c10's order, so that each
/// one's discriminant is its scalar type code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// `torch.uint8`.
    UInt8,
    /// `torch.int8`.
    Int8,
    /// `torch.int16`.
    Int16,
    /// `torch.int32`.
    Int32,
    /// `torch.int64`.
    Int64,
    /// `torch.float16` (half).
    Float16,
    /// `torch.float32`.
    Float32,
    /// `torch.float64` (double).
    Float64,
    /// `torch.complex32`.
    ComplexHalf,
    /// `torch.complex64`.
    Complex64,
    /// `torch.complex128`.
    Complex128,
    /// `torch.bool`.
    Bool,
    /// `torch.qint8` (quantized).
    QInt8,
    /// `torch.quint8` (quantized).
    QUInt8,
    /// `torch.qint32` (quantized).
    QInt32,
    /// `torch.bfloat16`.
    BFloat16,
    /// `torch.quint4x2`: two 4-bit quantized values per byte.
    QUInt4x2,
    /// `torch.quint2x4`: four 2-bit quantized values per byte.
    QUInt2x4,
    /// `torch.bits1x8`: raw bits.
    Bits1x8,
    /// `torch.bits2x4`: raw bits.
    Bits2x4,
    /// `torch.bits4x2`: raw bits.
    Bits4x2,
    /// `torch.bits8`: raw bits.
    Bits8,
    /// `torch.bits16`: raw bits.
    Bits16,
    /// `torch.float8_e5m2`.
    Float8E5M2,
    /// `torch.float8_e4m3fn`.
    Float8E4M3Fn,
    /// `torch.float8_e5m2fnuz`.
    Float8E5M2Fnuz,
    /// `torch.float8_e4m3fnuz`.
    Float8E4M3Fnuz,
    /// `torch.uint16`.
    UInt16,
    /// `torch.uint32`.
    UInt32,
    /// `torch.uint64`.
    UInt64,
}

impl DType {
    /// Parses the dtype spelling found inside `Tensor(...)` type strings. Spellings differ by
    /// compiler and PyTorch build (`long` vs `long int`, `c10::Half` vs `Half`).
    pub fn from_et_name(s: &str) -> Option<DType> {
        let s = s.trim();
        let s = s.strip_prefix("c10::").unwrap_or(s);
        Some(match s {
            "float" | "Float" | "float32" => DType::Float32,
            "double" | "Double" | "float64" => DType::Float64,
            "Half" | "half" | "float16" => DType::Float16,
            "BFloat16" | "bfloat16" => DType::BFloat16,
            "unsigned char" | "uint8_t" | "Byte" | "uint8" => DType::UInt8,
            "signed char" | "int8_t" | "Char" | "int8" | "char" => DType::Int8,
            "short" | "short int" | "int16_t" | "Short" | "int16" => DType::Int16,
            "int" | "int32_t" | "Int" | "int32" => DType::Int32,
            "long" | "long int" | "long long" | "long long int" | "int64_t" | "Long" | "int64" => {
                DType::Int64
            }
            "bool" | "Bool" => DType::Bool,
            "complex<c10::Half>" | "ComplexHalf" => DType::ComplexHalf,
            "complex<float>" | "ComplexFloat" | "complex64" => DType::Complex64,
            "complex<double>" | "ComplexDouble" | "complex128" => DType::Complex128,
            "qint8" | "QInt8" => DType::QInt8,
            "quint8" | "QUInt8" => DType::QUInt8,
            "qint32" | "QInt32" => DType::QInt32,
            "quint4x2" | "QUInt4x2" => DType::QUInt4x2,
            "quint2x4" | "QUInt2x4" => DType::QUInt2x4,
            "Float8_e5m2" => DType::Float8E5M2,
            "Float8_e4m3fn" => DType::Float8E4M3Fn,
            "Float8_e5m2fnuz" => DType::Float8E5M2Fnuz,
            "Float8_e4m3fnuz" => DType::Float8E4M3Fnuz,
            "unsigned short" | "uint16_t" | "UInt16" => DType::UInt16,
            "unsigned int" | "uint32_t" | "UInt32" => DType::UInt32,
            "unsigned long" | "unsigned long int" | "uint64_t" | "UInt64" => DType::UInt64,
            _ => {
                return (0..30)
                    .filter_map(DType::from_scalar_type_code)
                    .find(|d| d.name() == s)
            }
        })
    }

    /// The c10::ScalarType integer code, as ET records `dtype` arguments.
    pub fn from_scalar_type_code(code: i64) -> Option<DType> {
        use DType::*;
        const ORDER: [DType; 30] = [
            UInt8,
            Int8,
            Int16,
            Int32,
            Int64,
            Float16,
            Float32,
            Float64,
            ComplexHalf,
            Complex64,
            Complex128,
            Bool,
            QInt8,
            QUInt8,
            QInt32,
            BFloat16,
            QUInt4x2,
            QUInt2x4,
            Bits1x8,
            Bits2x4,
            Bits4x2,
            Bits8,
            Bits16,
            Float8E5M2,
            Float8E4M3Fn,
            Float8E5M2Fnuz,
            Float8E4M3Fnuz,
            UInt16,
            UInt32,
            UInt64,
        ];
        usize::try_from(code)
            .ok()
            .and_then(|i| ORDER.get(i).copied())
    }

    /// c10's `ScalarType` code (the variant's position in [`DType`]).
    pub fn scalar_type_code(self) -> i64 {
        self as i64
    }

    /// Bytes per element (packed sub-byte types count one byte per packed group).
    pub fn size_bytes(self) -> usize {
        use DType::*;
        match self {
            UInt8 | Int8 | Bool | QInt8 | QUInt8 | QUInt4x2 | QUInt2x4 | Bits1x8 | Bits2x4
            | Bits4x2 | Bits8 | Float8E5M2 | Float8E4M3Fn | Float8E5M2Fnuz | Float8E4M3Fnuz => 1,
            Int16 | Float16 | BFloat16 | Bits16 | UInt16 => 2,
            Int32 | Float32 | QInt32 | UInt32 | ComplexHalf => 4,
            Int64 | Float64 | Complex64 | UInt64 => 8,
            Complex128 => 16,
        }
    }

    /// Whether this is a real floating-point type (as `torch.is_floating_point`: no complex).
    pub fn is_floating_point(self) -> bool {
        use DType::*;
        matches!(
            self,
            Float16
                | Float32
                | Float64
                | BFloat16
                | Float8E5M2
                | Float8E4M3Fn
                | Float8E5M2Fnuz
                | Float8E4M3Fnuz
        )
    }

    /// Whether this is a plain integer type (no `bool`, no quantized types).
    pub fn is_integral(self) -> bool {
        use DType::*;
        matches!(
            self,
            UInt8 | Int8 | Int16 | Int32 | Int64 | UInt16 | UInt32 | UInt64
        )
    }

    /// The canonical name used in reports (PyTorch's `torch.<name>`).
    pub fn name(self) -> &'static str {
        use DType::*;
        match self {
            UInt8 => "uint8",
            Int8 => "int8",
            Int16 => "int16",
            Int32 => "int32",
            Int64 => "int64",
            Float16 => "float16",
            Float32 => "float32",
            Float64 => "float64",
            ComplexHalf => "complex32",
            Complex64 => "complex64",
            Complex128 => "complex128",
            Bool => "bool",
            QInt8 => "qint8",
            QUInt8 => "quint8",
            QInt32 => "qint32",
            BFloat16 => "bfloat16",
            QUInt4x2 => "quint4x2",
            QUInt2x4 => "quint2x4",
            Bits1x8 => "bits1x8",
            Bits2x4 => "bits2x4",
            Bits4x2 => "bits4x2",
            Bits8 => "bits8",
            Bits16 => "bits16",
            Float8E5M2 => "float8_e5m2",
            Float8E4M3Fn => "float8_e4m3fn",
            Float8E5M2Fnuz => "float8_e5m2fnuz",
            Float8E4M3Fnuz => "float8_e4m3fnuz",
            UInt16 => "uint16",
            UInt32 => "uint32",
            UInt64 => "uint64",
        }
    }

    /// The spelling the observer writes inside `Tensor(...)` (gcc build of PyTorch 2.x).
    pub fn et_name(self) -> &'static str {
        use DType::*;
        match self {
            Float32 => "float",
            Float64 => "double",
            Float16 => "c10::Half",
            BFloat16 => "c10::BFloat16",
            UInt8 => "unsigned char",
            Int8 => "signed char",
            Int16 => "short",
            Int32 => "int",
            Int64 => "long int",
            Bool => "bool",
            Complex64 => "c10::complex<float>",
            Complex128 => "c10::complex<double>",
            other => other.name(),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_that_differ_by_build_agree() {
        for s in ["long", "long int", "int64_t"] {
            assert_eq!(DType::from_et_name(s), Some(DType::Int64), "{s}");
        }
        assert_eq!(DType::from_et_name("c10::Half"), Some(DType::Float16));
        assert_eq!(DType::from_et_name("Half"), Some(DType::Float16));
        assert_eq!(DType::from_et_name("unsigned char"), Some(DType::UInt8));
        assert_eq!(DType::from_et_name("c10::BFloat16"), Some(DType::BFloat16));
        assert_eq!(DType::from_et_name("what"), None);
    }

    #[test]
    fn scalar_type_codes_round_trip() {
        for code in 0..30 {
            let d = DType::from_scalar_type_code(code).unwrap();
            assert_eq!(d.scalar_type_code(), code);
        }
        assert_eq!(DType::from_scalar_type_code(6), Some(DType::Float32));
        assert_eq!(DType::from_scalar_type_code(15), Some(DType::BFloat16));
        assert_eq!(DType::from_scalar_type_code(99), None);
        // The ET spelling re-parses to the same dtype.
        for code in 0..30 {
            let d = DType::from_scalar_type_code(code).unwrap();
            assert_eq!(DType::from_et_name(d.et_name()), Some(d), "{d}");
        }
    }
}
