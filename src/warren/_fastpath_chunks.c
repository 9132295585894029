/* warren._fastpath: deliver_entries, a stream's chunk record to deliveries.
 *
 * (Written from its callers and tests: core/stream_delivery.py's backlog path,
 * store/stream_cursor.py's entries(), store/stream_records.py's EntryDecoder,
 * amqp/consumer.py's AMQPConsumer.deliver_entries, tests/core/test_chunk_spans.py.)
 */
#include "_fastpath.h"

/* Where the data section of the AMQP 1.0 message e[0:size] starts and how
 * long the sections before it are (*prefix), when the message is simple: the
 * sections before it are a header, delivery or message annotations,
 * properties or application properties, each a list or a map (or null) behind
 * a small-ulong descriptor, and one data section (vbin8 or vbin32) runs to the
 * end. -1 otherwise (another body, a footer, another encoding): such a message
 * is the one-by-one path's (StreamCursor.next). What the sections hold is not
 * looked at: the Python mapping of the first message with those bytes decides
 * (EntryDecoder.learn). */
static Py_ssize_t data_section(const unsigned char *e, Py_ssize_t size, Py_ssize_t *prefix) {
    Py_ssize_t a = 0;
    while (size - a >= 4) {
        if (e[a] != 0x00 || e[a + 1] != 0x53) return -1;
        unsigned char code = e[a + 2];
        unsigned char ctor = e[a + 3];
        Py_ssize_t v = a + 3;
        if (code == 0x75) {
            Py_ssize_t at, len;
            if (ctor == 0xA0) {
                if (size - v < 2) return -1;
                len = e[v + 1];
                at = v + 2;
            } else if (ctor == 0xB0) {
                if (size - v < 5) return -1;
                len = (Py_ssize_t)be32(e + v + 1);
                at = v + 5;
            } else {
                return -1;
            }
            if (size - at != len) return -1;
            *prefix = a;
            return at;
        }
        if (code < 0x70 || code > 0x74) return -1;
        switch (ctor) {
        case 0x40: /* null */
        case 0x45: /* list0 */
            a = v + 1;
            break;
        case 0xC0: case 0xC1: /* list8, map8 */
            if (size - v < 2) return -1;
            a = v + 2 + e[v + 1];
            break;
        case 0xD0: case 0xD1: /* list32, map32 */
            if (size - v < 5) return -1;
            a = v + 5 + (Py_ssize_t)be32(e + v + 1);
            if (a < v) return -1;
            break;
        default:
            return -1;
        }
        if (a > size) return -1;
    }
    return -1;
}

/* One entry's place and layout, between the two passes. */
typedef struct {
    Py_ssize_t data;  /* its body's start in the buffer */
    Py_ssize_t body;  /* its body's size */
    Py_ssize_t next;  /* where the next entry starts */
    Py_ssize_t layout; /* index into the layouts met */
} Entry;

/* A layout's stamped properties, as EntryDecoder.learn gives them: the
 * properties with x-stream-offset and x-stream-timestamp, and where the two
 * 8-byte values are in them. */
typedef struct {
    PyObject *key;  /* the sections before the data section (a strong reference) */
    PyObject *item; /* (properties, offset_at, ts_at) (a strong reference) */
    const unsigned char *props;
    Py_ssize_t len, offset_at, ts_at;
} Layout;

#define MAX_LAYOUTS_PER_CALL 64

/* The layout of sections e[0:prefix], from layouts or learned: its index, -1
 * for an entry the one-by-one path takes (learn said None, or there are too
 * many layouts in one call), -2 on an error (set). */
static Py_ssize_t find_layout(Layout *met, Py_ssize_t *n_met, PyObject *layouts, PyObject *learn,
                              const unsigned char *e, Py_ssize_t size, Py_ssize_t prefix) {
    for (Py_ssize_t i = *n_met - 1; i >= 0; i--) {
        if (PyBytes_GET_SIZE(met[i].key) == prefix &&
            memcmp(PyBytes_AS_STRING(met[i].key), e, (size_t)prefix) == 0)
            return i;
    }
    if (*n_met == MAX_LAYOUTS_PER_CALL) return -1;
    PyObject *key = PyBytes_FromStringAndSize((const char *)e, prefix);
    if (key == NULL) return -2;
    PyObject *item = PyDict_GetItemWithError(layouts, key);
    if (item != NULL) {
        Py_INCREF(item);
    } else if (PyErr_Occurred()) {
        Py_DECREF(key);
        return -2;
    } else {
        PyObject *entry = PyBytes_FromStringAndSize((const char *)e, size);
        if (entry == NULL) {
            Py_DECREF(key);
            return -2;
        }
        item = PyObject_CallFunctionObjArgs(learn, key, entry, NULL);
        Py_DECREF(entry);
        if (item == NULL) {
            Py_DECREF(key);
            return -2;
        }
    }
    if (item == Py_None) {
        Py_DECREF(item);
        Py_DECREF(key);
        return -1;
    }
    Py_ssize_t offset_at, ts_at;
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3 ||
        !PyBytes_Check(PyTuple_GET_ITEM(item, 0))) {
        PyErr_SetString(PyExc_TypeError, "deliver_entries: a layout is (bytes, int, int) or None");
        goto fail;
    }
    offset_at = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 1));
    ts_at = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 2));
    if (PyErr_Occurred()) goto fail;
    Py_ssize_t len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(item, 0));
    if (offset_at < 0 || ts_at < 0 || offset_at > len - 8 || ts_at > len - 8) {
        PyErr_SetString(PyExc_ValueError, "deliver_entries: a layout's stamps out of bounds");
        goto fail;
    }
    Layout *l = &met[*n_met];
    l->key = key;
    l->item = item;
    l->props = (const unsigned char *)PyBytes_AS_STRING(PyTuple_GET_ITEM(item, 0));
    l->len = len;
    l->offset_at = offset_at;
    l->ts_at = ts_at;
    return (*n_met)++;
fail:
    Py_DECREF(item);
    Py_DECREF(key);
    return -2;
}

/* deliver_entries(buf, pos, end, max_n, offset, ts, layouts, learn, channel, deliver_head,
 *                 first_tag, frame_max, ex_rk, max_bytes=0) -> (frames, n, next, sizes)
 *
 * The simple data entries of a stream's chunk record from buf[pos] on (its
 * map; end: where the chunk's data ends), at most max_n of them, with offsets
 * from offset on and the chunk's timestamp ts, as the deliveries a consumer
 * gets, in one bytes object: what StreamCursor.next and AMQPConsumer.deliver
 * make of them one at a time (the Python path, the reference: each entry's
 * AMQP 1.0 message through the stream's EntryDecoder, its properties stamped
 * with x-stream-offset and x-stream-timestamp, framed by amqp/frames.py's
 * message_frames with deliver_head, a tag counting up from first_tag, not
 * redelivered, and ex_rk: the exchange and routing key as shortstrs).
 *
 * An entry's properties come from layouts (a dict: the message's sections
 * before its data section -> (stamped properties, where the offset and the
 * timestamp go in them), or None), filled by learn(prefix, message) from the
 * first message of each layout; its body is its data section. Stops before an
 * entry that is not a simple AMQP 1.0 message (data_section), one whose
 * layout is None, a sub-batch entry, one past end, and the one that would
 * take the frames past max_bytes (0: no limit; never the first). n: how many
 * entries were framed; next: where the next one starts; sizes: each body's
 * size as native u32s. The buffer is released before returning. */
PyObject *deliver_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 13 || nargs > 14) {
        PyErr_SetString(PyExc_TypeError, "deliver_entries(buf, pos, end, max_n, offset, ts, "
                                         "layouts, learn, channel, deliver_head, first_tag, "
                                         "frame_max, ex_rk, max_bytes=0)");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    Py_ssize_t max_n = PyLong_AsSsize_t(args[3]);
    unsigned long long offset = PyLong_AsUnsignedLongLong(args[4]);
    unsigned long long ts = PyLong_AsUnsignedLongLong(args[5]);
    PyObject *layouts = args[6];
    PyObject *learn = args[7];
    Py_ssize_t channel = PyLong_AsSsize_t(args[8]);
    unsigned long long first_tag = PyLong_AsUnsignedLongLong(args[10]);
    Py_ssize_t frame_max = PyLong_AsSsize_t(args[11]);
    Py_ssize_t max_bytes = nargs > 13 ? PyLong_AsSsize_t(args[13]) : 0;
    if (PyErr_Occurred()) return NULL;
    if (!PyDict_Check(layouts) || !PyCallable_Check(learn) || !PyBytes_Check(args[9]) ||
        !PyBytes_Check(args[12])) {
        PyErr_SetString(PyExc_TypeError, "deliver_entries: layouts must be a dict, learn a "
                                         "callable, deliver_head and ex_rk bytes");
        return NULL;
    }
    if (channel < 0 || channel > 0xFFFF || pos < 0) {
        PyErr_SetString(PyExc_ValueError, "deliver_entries: bad channel or position");
        return NULL;
    }
    if (end > pos && max_n > (end - pos) / 4) max_n = (end - pos) / 4; /* 4 bytes an entry at least */
    if (max_n < 0 || end <= pos) max_n = 0;
    const unsigned char *head = (const unsigned char *)PyBytes_AS_STRING(args[9]);
    Py_ssize_t head_len = PyBytes_GET_SIZE(args[9]);
    const unsigned char *ex_rk = (const unsigned char *)PyBytes_AS_STRING(args[12]);
    Py_ssize_t ex_rk_len = PyBytes_GET_SIZE(args[12]);
    Py_ssize_t chunk = frame_max > 8 ? frame_max - 8 : PY_SSIZE_T_MAX;

    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    if (end > view.len) end = view.len;

    PyObject *result = NULL;
    PyObject *out = NULL, *sizes = NULL;
    Layout met[MAX_LAYOUTS_PER_CALL];
    Py_ssize_t n_met = 0;
    Py_ssize_t n = 0;
    Py_ssize_t q = pos;
    Py_ssize_t total = 0;
    Entry *entries = max_n ? PyMem_Malloc((size_t)max_n * sizeof(Entry)) : NULL;
    if (max_n && entries == NULL) {
        PyErr_NoMemory();
        goto done;
    }

    /* First pass: which entries are simple, their layouts and the frames' size. */
    while (n < max_n && end - q >= 4) {
        uint32_t field = be32(p + q);
        if (field & 0x80000000u) break; /* a sub-batch entry: one by one */
        Py_ssize_t size = (Py_ssize_t)field;
        if (end - q - 4 < size) break;
        const unsigned char *e = p + q + 4;
        Py_ssize_t prefix = 0;
        Py_ssize_t data = data_section(e, size, &prefix);
        if (data < 0) break;
        Py_ssize_t layout = find_layout(met, &n_met, layouts, learn, e, size, prefix);
        if (layout == -2) goto done;
        if (layout < 0) break;
        Py_ssize_t body = size - data;
        Py_ssize_t frames = 8 + head_len + 9 + ex_rk_len; /* method frame */
        frames += 8 + 12 + met[layout].len;                /* content header */
        if (body) frames += body + 8 * ((body - 1) / chunk + 1);
        if (n && max_bytes > 0 && total + frames > max_bytes) break;
        total += frames;
        entries[n].data = q + 4 + data;
        entries[n].body = body;
        entries[n].layout = layout;
        q += 4 + size;
        entries[n].next = q;
        n++;
    }
    if (n == 0) {
        result = Py_BuildValue("(y#nny#)", "", (Py_ssize_t)0, (Py_ssize_t)0, pos, "",
                               (Py_ssize_t)0);
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    sizes = PyBytes_FromStringAndSize(NULL, n * 4);
    if (out == NULL || sizes == NULL) goto done;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    uint32_t *size_out = (uint32_t *)PyBytes_AS_STRING(sizes);
    for (Py_ssize_t i = 0; i < n; i++) {
        const Layout *l = &met[entries[i].layout];
        Py_ssize_t body = entries[i].body;
        const unsigned char *b = p + entries[i].data;
        *size_out++ = (uint32_t)body;
        o = put_frame_head(o, 1, (uint16_t)channel, (uint32_t)(head_len + 9 + ex_rk_len));
        memcpy(o, head, (size_t)head_len);
        o += head_len;
        o = put_be64(o, first_tag + (uint64_t)i);
        *o++ = 0; /* not redelivered */
        memcpy(o, ex_rk, (size_t)ex_rk_len);
        o += ex_rk_len;
        *o++ = 0xCE;
        o = put_frame_head(o, 2, (uint16_t)channel, (uint32_t)(12 + l->len));
        *o++ = 0; *o++ = 60; *o++ = 0; *o++ = 0; /* class 60, weight 0 */
        o = put_be64(o, (uint64_t)body);
        memcpy(o, l->props, (size_t)l->len);
        put_be64(o + l->offset_at, offset + (uint64_t)i);
        put_be64(o + l->ts_at, ts);
        o += l->len;
        *o++ = 0xCE;
        for (Py_ssize_t at = 0; at < body; at += chunk) {
            Py_ssize_t part = body - at < chunk ? body - at : chunk;
            o = put_frame_head(o, 3, (uint16_t)channel, (uint32_t)part);
            memcpy(o, b + at, (size_t)part);
            o += part;
            *o++ = 0xCE;
        }
    }
    if (o != (unsigned char *)PyBytes_AS_STRING(out) + total) { /* sizes and writes disagree */
        PyErr_SetString(PyExc_SystemError, "deliver_entries: size mismatch");
        goto done;
    }
    result = Py_BuildValue("(OnnO)", out, n, entries[n - 1].next, sizes);
done:
    Py_XDECREF(out);
    Py_XDECREF(sizes);
    for (Py_ssize_t i = 0; i < n_met; i++) {
        Py_DECREF(met[i].key);
        Py_DECREF(met[i].item);
    }
    PyMem_Free(entries);
    PyBuffer_Release(&view);
    return result;
}
