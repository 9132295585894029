# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The kernel in typed Cython (cdef functions, a const memoryview on the input,
one bytes result written through a char pointer). Semantics: fastpath_py.py."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy


cdef inline uint32_t rd16(const unsigned char *p) noexcept nogil:
    return (<uint32_t>p[0] << 8) | p[1]


cdef inline uint32_t rd32(const unsigned char *p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline unsigned char *wr16(unsigned char *o, uint32_t v) noexcept nogil:
    o[0] = <unsigned char>(v >> 8)
    o[1] = <unsigned char>v
    return o + 2


cdef inline unsigned char *wr32(unsigned char *o, uint32_t v) noexcept nogil:
    o[0] = <unsigned char>(v >> 24)
    o[1] = <unsigned char>(v >> 16)
    o[2] = <unsigned char>(v >> 8)
    o[3] = <unsigned char>v
    return o + 4


cdef struct Msg:
    Py_ssize_t names_at, names_len, header_at, header_len, body_at, end
    uint64_t body_size
    int body_frames


cdef inline Py_ssize_t frame_at(const unsigned char *d, Py_ssize_t n, Py_ssize_t p,
                                unsigned int ftype, unsigned int channel, uint32_t limit) noexcept nogil:
    cdef uint32_t size
    if n - p < 8 or d[p] != ftype or rd16(d + p + 1) != channel:
        return -1
    size = rd32(d + p + 3)
    if size > limit or <Py_ssize_t>size > n - p - 8 or d[p + 7 + size] != 0xCE:
        return -1
    return <Py_ssize_t>size


cdef bint parse_message(const unsigned char *d, Py_ssize_t n, Py_ssize_t p,
                        unsigned int channel, uint32_t limit, Msg *m) noexcept nogil:
    cdef Py_ssize_t size = frame_at(d, n, p, 1, channel, limit)
    cdef Py_ssize_t rk, bits
    cdef const unsigned char *pl
    cdef uint64_t remaining
    if size < 9:
        return False
    pl = d + p + 7
    if rd16(pl) != 60 or rd16(pl + 2) != 40:
        return False
    rk = 7 + pl[6]
    if rk >= size:
        return False
    bits = rk + 1 + pl[rk]
    if bits + 1 != size or (pl[bits] & 3):
        return False
    m.names_at = p + 13
    m.names_len = bits - 6
    p += 8 + size
    size = frame_at(d, n, p, 2, channel, limit)
    if size < 14:
        return False
    pl = d + p + 7
    if rd16(pl) != 60 or rd16(pl + 2) != 0:
        return False
    m.header_at = p
    m.header_len = size + 8
    m.body_size = (<uint64_t>rd32(pl + 4) << 32) | rd32(pl + 8)
    p += 8 + size
    m.body_at = p
    m.body_frames = 0
    remaining = m.body_size
    while remaining > 0:
        size = frame_at(d, n, p, 3, channel, limit)
        if size <= 0 or <uint64_t>size > remaining:
            return False
        remaining -= <uint64_t>size
        m.body_frames += 1
        p += 8 + size
    m.end = p
    return True


def publish_to_deliver(const unsigned char[::1] data, Py_ssize_t start, unsigned int channel,
                       const unsigned char[::1] ctag_head, uint64_t first_tag, Py_ssize_t frame_max):
    if start < 0 or channel > 65535 or frame_max < 4096:
        raise ValueError("bad start, channel or frame_max")
    cdef Py_ssize_t n = data.shape[0]
    cdef const unsigned char *d = &data[0] if n else NULL
    cdef Py_ssize_t ctag_len = ctag_head.shape[0]
    cdef const unsigned char *ctag = &ctag_head[0] if ctag_len else NULL
    cdef uint32_t limit = <uint32_t>(frame_max - 8)
    cdef Py_ssize_t deliver_len = 4 + ctag_len + 9
    cdef Py_ssize_t pos = start, count = 0, total = 0, i, p, q, in_left, take
    cdef Msg m
    cdef uint64_t tag = first_tag, left
    cdef uint32_t chunk
    cdef const unsigned char *src
    cdef unsigned char *o
    if n == 0:
        return start, 0, b""
    with nogil:
        while parse_message(d, n, pos, channel, limit, &m):
            total += 8 + deliver_len + m.names_len + m.header_len
            if m.body_frames == 1:
                total += 8 + <Py_ssize_t>m.body_size
            elif m.body_size:
                total += <Py_ssize_t>m.body_size + 8 * <Py_ssize_t>((m.body_size + limit - 1) // limit)
            count += 1
            pos = m.end
    out = PyBytes_FromStringAndSize(NULL, total)
    o = <unsigned char *>PyBytes_AS_STRING(out)
    p = start
    with nogil:
        for i in range(count):
            parse_message(d, n, p, channel, limit, &m)
            o[0] = 1
            o = wr16(o + 1, channel)
            o = wr32(o, <uint32_t>(deliver_len + m.names_len))
            o[0] = 0; o[1] = 0x3c; o[2] = 0; o[3] = 0x3c
            o += 4
            memcpy(o, ctag, ctag_len)
            o += ctag_len
            o = wr32(wr32(o, <uint32_t>(tag >> 32)), <uint32_t>tag)
            tag += 1
            o[0] = 0
            o += 1
            memcpy(o, d + m.names_at, m.names_len)
            o += m.names_len
            o[0] = 0xCE
            o += 1
            memcpy(o, d + m.header_at, m.header_len)
            o += m.header_len
            if m.body_frames == 1:
                memcpy(o, d + m.body_at, 8 + m.body_size)
                o += 8 + m.body_size
            elif m.body_frames > 1:
                q = m.body_at
                in_left = 0
                src = NULL
                left = m.body_size
                while left > 0:
                    chunk = limit if left > limit else <uint32_t>left
                    o[0] = 3
                    o = wr32(wr16(o + 1, channel), chunk)
                    left -= chunk
                    while chunk > 0:
                        if in_left == 0:
                            in_left = rd32(d + q + 3)
                            src = d + q + 7
                            q += 8 + in_left
                        take = in_left if in_left < <Py_ssize_t>chunk else <Py_ssize_t>chunk
                        memcpy(o, src, take)
                        o += take
                        src += take
                        in_left -= take
                        chunk -= <uint32_t>take
                    o[0] = 0xCE
                    o += 1
            p = m.end
    return pos, count, out
