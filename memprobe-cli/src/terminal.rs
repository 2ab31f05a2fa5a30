//! The terminal: whether a descriptor is one, its size, and lines cut to
//! its width (`watch` redraws its screen with them, `run` its live line).

/// Whether file descriptor `fd` is a terminal.
pub(crate) fn is_tty(fd: libc::c_int) -> bool {
    // SAFETY: isatty has no memory preconditions.
    unsafe { libc::isatty(fd) == 1 }
}

/// (columns, rows) of the terminal on `fd`, if it is one.
pub(crate) fn terminal_size(fd: libc::c_int) -> Option<(usize, usize)> {
    // SAFETY: winsize is plain data.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes a winsize into the valid pointer.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_col > 0).then(|| (usize::from(ws.ws_col), usize::from(ws.ws_row)))
}

/// Cuts `s` to at most `width` characters.
pub(crate) fn truncate(s: &str, width: usize) -> &str {
    match s.char_indices().nth(width) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_counts_characters() {
        assert_eq!(truncate("héllo", 2), "hé");
        assert_eq!(truncate("hi", 10), "hi");
    }
}
