//! The limits every layer checks against: key and value sizes and the inline-value
//! threshold, with the checks that enforce them on user input.
//!
//! Provenance: keys are at most 2 KiB so that a branch node of 8 KiB (`btree::node`)
//! always holds at least three separators; values up to 1 GiB keep every length a
//! `u32` on disk; values above 1 KiB go out of line so a leaf holds several entries.

use crate::error::{Error, Result};

/// The longest key, in bytes.
pub const MAX_KEY_LEN: usize = 2048;
/// The longest value, in bytes (values above [`INLINE_VALUE_MAX`] live in their own extent).
pub const MAX_VALUE_LEN: usize = 1 << 30;
/// Values longer than this are written once into an extent of their own, out of the
/// tree nodes and out of the WAL.
pub const INLINE_VALUE_MAX: usize = 1024;

/// Checks a key given by a user: 1 to [`MAX_KEY_LEN`] bytes.
pub fn check_key(key: &[u8]) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(Error::KeyTooLarge {
            len: key.len(),
            max: MAX_KEY_LEN,
        });
    }
    Ok(())
}

/// Checks a value given by a user: at most [`MAX_VALUE_LEN`] bytes.
pub fn check_value(value: &[u8]) -> Result<()> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Error::ValueTooLarge {
            len: value.len(),
            max: MAX_VALUE_LEN,
        });
    }
    Ok(())
}

/// The smallest key greater than every key starting with `prefix`, if one exists
/// (the exclusive upper bound of a prefix scan).
pub fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_successors() {
        assert_eq!(prefix_successor(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_successor(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_successor(b"\xff\xff"), None);
    }

    #[test]
    fn key_bounds() {
        assert!(check_key(b"").is_err());
        assert!(check_key(&[0; MAX_KEY_LEN]).is_ok());
        assert!(check_key(&[0; MAX_KEY_LEN + 1]).is_err());
    }
}
