//! The kernel in Rust through PyO3: one pass checks the frames and sizes the
//! result, a second writes it into one bytes object. Semantics: fastpath_py.py.

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pyo3::AsPyPointer;

#[inline(always)]
fn rd16(d: &[u8], p: usize) -> u32 {
    u16::from_be_bytes([d[p], d[p + 1]]) as u32
}

#[inline(always)]
fn rd32(d: &[u8], p: usize) -> u32 {
    u32::from_be_bytes(d[p..p + 4].try_into().unwrap())
}

#[inline(always)]
fn rd64(d: &[u8], p: usize) -> u64 {
    u64::from_be_bytes(d[p..p + 8].try_into().unwrap())
}

/// The payload size of a complete frame of this type on this channel at p.
#[inline(always)]
fn frame_at(d: &[u8], p: usize, ftype: u8, channel: u32, limit: u32) -> Option<usize> {
    if d.len() < p + 8 || d[p] != ftype || rd16(d, p + 1) != channel {
        return None;
    }
    let size = rd32(d, p + 3);
    if size > limit || size as usize > d.len() - p - 8 || d[p + 7 + size as usize] != 0xCE {
        return None;
    }
    Some(size as usize)
}

struct Msg {
    names_at: usize,
    names_len: usize,
    header_at: usize,
    header_len: usize,
    body_at: usize,
    body_size: u64,
    body_frames: u32,
    end: usize,
}

fn parse_message(d: &[u8], mut p: usize, channel: u32, limit: u32) -> Option<Msg> {
    let size = frame_at(d, p, 1, channel, limit)?;
    if size < 9 {
        return None;
    }
    let pl = p + 7;
    if rd16(d, pl) != 60 || rd16(d, pl + 2) != 40 {
        return None;
    }
    let rk = 7 + d[pl + 6] as usize;
    if rk >= size {
        return None;
    }
    let bits = rk + 1 + d[pl + rk] as usize;
    if bits + 1 != size || d[pl + bits] & 3 != 0 {
        return None;
    }
    let names_at = pl + 6;
    let names_len = bits - 6;
    p += 8 + size;
    let size = frame_at(d, p, 2, channel, limit)?;
    if size < 14 {
        return None;
    }
    let pl = p + 7;
    if rd16(d, pl) != 60 || rd16(d, pl + 2) != 0 {
        return None;
    }
    let header_at = p;
    let header_len = size + 8;
    let body_size = rd64(d, pl + 4);
    p += 8 + size;
    let body_at = p;
    let mut body_frames = 0;
    let mut remaining = body_size;
    while remaining > 0 {
        let size = frame_at(d, p, 3, channel, limit)?;
        if size == 0 || size as u64 > remaining {
            return None;
        }
        remaining -= size as u64;
        body_frames += 1;
        p += 8 + size;
    }
    Some(Msg { names_at, names_len, header_at, header_len, body_at, body_size, body_frames, end: p })
}

fn write(o: &mut [u8], at: &mut usize, src: &[u8]) {
    o[*at..*at + src.len()].copy_from_slice(src);
    *at += src.len();
}

fn frame_head(o: &mut [u8], at: &mut usize, ftype: u8, channel: u32, size: u32) {
    o[*at] = ftype;
    o[*at + 1..*at + 3].copy_from_slice(&(channel as u16).to_be_bytes());
    o[*at + 3..*at + 7].copy_from_slice(&size.to_be_bytes());
    *at += 7;
}

#[pyfunction]
fn publish_to_deliver<'py>(
    py: Python<'py>,
    data: &[u8],
    start: usize,
    channel: u32,
    ctag_head: &[u8],
    first_tag: u64,
    frame_max: usize,
) -> PyResult<(usize, usize, &'py PyBytes)> {
    if channel > 65535 || frame_max < 4096 {
        return Err(PyValueError::new_err("bad channel or frame_max"));
    }
    let limit = (frame_max - 8) as u32;
    let deliver_len = 4 + ctag_head.len() + 9;
    let (mut pos, mut count, mut total) = (start, 0usize, 0usize);
    while let Some(m) = parse_message(data, pos, channel, limit) {
        total += 8 + deliver_len + m.names_len + m.header_len;
        if m.body_frames == 1 {
            total += 8 + m.body_size as usize;
        } else if m.body_size > 0 {
            let l = limit as u64;
            total += m.body_size as usize + 8 * ((m.body_size + l - 1) / l) as usize;
        }
        count += 1;
        pos = m.end;
    }
    // An uninitialised bytes object (PyBytes::new_with would zero it first).
    let out: &PyBytes = unsafe {
        py.from_owned_ptr_or_err(ffi::PyBytes_FromStringAndSize(std::ptr::null(), total as ffi::Py_ssize_t))?
    };
    let o: &mut [u8] =
        unsafe { std::slice::from_raw_parts_mut(ffi::PyBytes_AsString(out.as_ptr()) as *mut u8, total) };
    let mut at = 0usize;
    let mut p = start;
    let mut tag = first_tag;
    for _ in 0..count {
        let m = parse_message(data, p, channel, limit).unwrap();
        frame_head(o, &mut at, 1, channel, (deliver_len + m.names_len) as u32);
        write(o, &mut at, b"\x00\x3c\x00\x3c");
        write(o, &mut at, ctag_head);
        write(o, &mut at, &tag.to_be_bytes());
        write(o, &mut at, b"\x00");
        write(o, &mut at, &data[m.names_at..m.names_at + m.names_len]);
        write(o, &mut at, b"\xce");
        write(o, &mut at, &data[m.header_at..m.header_at + m.header_len]);
        if m.body_frames == 1 {
            write(o, &mut at, &data[m.body_at..m.body_at + 8 + m.body_size as usize]);
        } else if m.body_frames > 1 {
            let (mut q, mut src, mut in_left) = (m.body_at, 0usize, 0usize);
            let mut left = m.body_size;
            while left > 0 {
                let mut chunk = left.min(limit as u64) as usize;
                frame_head(o, &mut at, 3, channel, chunk as u32);
                left -= chunk as u64;
                while chunk > 0 {
                    if in_left == 0 {
                        in_left = rd32(data, q + 3) as usize;
                        src = q + 7;
                        q += 8 + in_left;
                    }
                    let take = in_left.min(chunk);
                    write(o, &mut at, &data[src..src + take]);
                    src += take;
                    in_left -= take;
                    chunk -= take;
                }
                write(o, &mut at, b"\xce");
            }
        }
        tag = tag.wrapping_add(1);
        p = m.end;
    }
    debug_assert_eq!(at, total);
    Ok((pos, count, out))
}

#[pymodule]
fn fastpath_rs(_py: Python<'_>, m: &PyModule) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(publish_to_deliver, m)?)?;
    Ok(())
}
