//! 16-bit floats as the library takes them ([`F16`], [`BF16`]): the bits, with the C
//! library's conversions from and to `f32` (round to nearest, ties to even). The workers
//! reduce them in `f32` and round once. Both are `#[repr(transparent)]` over `u16`, the
//! layout of the `half` crate's `f16` and `bf16` (and burn's), so a slice of those can be
//! viewed as a slice of these.

use devcoord_sys as sys;

/// IEEE 754 binary16: 1 sign, 5 exponent, 10 fraction bits.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct F16(pub u16);

/// bfloat16: the upper half of an `f32` (1 sign, 8 exponent, 7 fraction bits).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BF16(pub u16);

impl F16 {
    /// The nearest binary16 (ties to even); too large: infinity; NaN stays a NaN
    /// (`dc_float_to_f16`).
    pub fn from_f32(x: f32) -> F16 {
        // SAFETY: a pure function of its argument.
        F16(unsafe { sys::dc_float_to_f16(x) })
    }

    /// The exact `f32` (`dc_f16_to_float`).
    pub fn to_f32(self) -> f32 {
        // SAFETY: as from_f32.
        unsafe { sys::dc_f16_to_float(self.0) }
    }
}

impl BF16 {
    /// The nearest bfloat16 (ties to even); NaN stays a NaN (`dc_float_to_bf16`).
    pub fn from_f32(x: f32) -> BF16 {
        // SAFETY: a pure function of its argument.
        BF16(unsafe { sys::dc_float_to_bf16(x) })
    }

    /// The exact `f32` (`dc_bf16_to_float`).
    pub fn to_f32(self) -> f32 {
        // SAFETY: as from_f32.
        unsafe { sys::dc_bf16_to_float(self.0) }
    }
}

macro_rules! from_f32 {
    ($t:ident) => {
        impl From<f32> for $t {
            fn from(x: f32) -> $t {
                $t::from_f32(x)
            }
        }

        impl From<$t> for f32 {
            fn from(x: $t) -> f32 {
                x.to_f32()
            }
        }
    };
}
from_f32!(F16);
from_f32!(BF16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_known_values() {
        for (x, bits) in [
            (0.0f32, 0x0000u16),
            (-0.0, 0x8000),
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (0.5, 0x3800),
            (65504.0, 0x7bff),          // the largest
            (65520.0, 0x7c00),          // rounds up to infinity
            (6.103_515_6e-5, 0x0400),   // the smallest normal
            (5.960_464_5e-8, 0x0001),   // the smallest subnormal
            (2.980_232_2e-8, 0x0000),   // half of it: ties to even (0)
            (1.0 + 1.0 / 2048.0, 0x3c00), // halfway between 1 and the next: to even
            (1.0 + 3.0 / 2048.0, 0x3c02), // halfway, odd below: up
            (f32::INFINITY, 0x7c00),
        ] {
            assert_eq!(F16::from_f32(x).0, bits, "{}", x);
        }
        assert!(F16::from_f32(f32::NAN).to_f32().is_nan());
    }

    #[test]
    fn f16_round_trips_every_finite_value() {
        for bits in 0..=0xffffu16 {
            let h = F16(bits);
            let x = h.to_f32();
            if x.is_nan() {
                assert_eq!(bits & 0x7c00, 0x7c00);
                continue;
            }
            assert_eq!(F16::from_f32(x), h, "{:#06x} -> {}", bits, x);
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(BF16::from_f32(1.0).0, 0x3f80);
        assert_eq!(BF16::from_f32(f32::from_bits(0x3f80_8000)).0, 0x3f80); // tie, even below
        assert_eq!(BF16::from_f32(f32::from_bits(0x3f81_8000)).0, 0x3f82); // tie, odd below
        assert_eq!(BF16::from_f32(f32::from_bits(0x3f80_8001)).0, 0x3f81);
        assert_eq!(BF16(0x4049).to_f32(), 3.140_625);
        assert!(BF16::from_f32(f32::NAN).to_f32().is_nan());
        for bits in 0..=0xffffu16 {
            let x = BF16(bits).to_f32();
            if !x.is_nan() {
                assert_eq!(BF16::from_f32(x).0, bits);
            }
        }
    }
}
