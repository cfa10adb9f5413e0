//! Sequence-number arithmetic modulo 2^32 (RFC 9293 3.4).

#[inline]
pub fn lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}
#[inline]
pub fn le(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) <= 0
}
#[inline]
pub fn gt(a: u32, b: u32) -> bool {
    lt(b, a)
}
#[inline]
pub fn ge(a: u32, b: u32) -> bool {
    le(b, a)
}
#[inline]
pub fn max(a: u32, b: u32) -> u32 {
    if lt(a, b) { b } else { a }
}
#[inline]
pub fn min(a: u32, b: u32) -> u32 {
    if lt(a, b) { a } else { b }
}
/// `a - b` as a byte count; 0 if `a` is before `b`.
#[inline]
pub fn dist(a: u32, b: u32) -> u32 {
    if lt(a, b) { 0 } else { a.wrapping_sub(b) }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn wraps() {
        assert!(lt(u32::MAX, 0));
        assert!(gt(5, u32::MAX - 5));
        assert_eq!(dist(3, u32::MAX), 4);
        assert_eq!(dist(u32::MAX, 3), 0);
        assert_eq!(max(u32::MAX, 1), 1);
    }
}
