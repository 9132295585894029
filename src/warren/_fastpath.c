/* warren._fastpath: the hot path's byte work in C.
 *
 * scan_publishes() is warren/amqp/publish_run.py's scan_publishes without a
 * Python object per message: it walks the frames of one socket read and
 * records, in a C array inside one PublishRun object, where each message's
 * property list and body lie. publish_run.py is the reference (and the
 * fallback without a compiler); tests/protocol/amqp/test_publish_run.py checks both
 * alike.
 *
 * scan_acks() finds the run of single basic.ack frames (or basic.reject, or
 * basic.nack with multiple clear) with consecutive tags
 * that starts where the read loop stands (amqp/ack_scan.py is its reference).
 *
 * deliver_frames() writes what a consumer gets for a run's messages
 * (amqp/consumer.py's AMQPConsumer.deliver_run and deliver_stored_run),
 * straight from the publisher's bytes; amqp/frames.py's message_frames is its
 * reference.
 *
 * encode_records() writes the segment-store records of a run's messages (for
 * an acknowledging consumer, stored before they are delivered), with their
 * CRC-32; store/records.py's encode_run is its reference. encode_stream_records()
 * writes a stream's records for a run, stamped with their offsets
 * (store/stream_store.py's StreamStore.append_run). crc_ok() checks a
 * record's CRC-32 where it lies (a memory map) on the read path; records.py's
 * _crc_ok is its reference. find_record() finds where intact records resume
 * after damaged bytes; store/segment_damage.py's next_record is its reference.
 *
 * scan_stream_deliveries() is the Spark source's read loop (spark/scan.py) for
 * stream deliveries of the common shape: their values go to column buffers
 * that become Arrow arrays without a Python object per row; encode_publishes()
 * is the sink's (spark/publish.py): a body column's rows to publish frames.
 *
 * deliver_records() frames a consumer's deliveries straight from the segment
 * store's records in a memory map (a stream's backlog, core/stream_queue.py,
 * and a classic queue's, core/queue.py); amqp/record_deliveries.py's
 * deliver_records_python is its reference. deliver_entries() does the same
 * for a stream's chunk record (its AMQP 1.0 messages; _fastpath_chunks.c),
 * whose Python path (StreamCursor.next) is its reference.
 *
 * The sources: this file (the module and its init), _fastpath.h (what they
 * share), _fastpath_scan.c, _fastpath_run.c (the PublishRun type),
 * _fastpath_deliver.c, _fastpath_records.c, _fastpath_spark.c, _fastpath_stream.c and
 * _fastpath_chunks.c,
 * compiled into one extension.
 * setup.py builds it when a C compiler is there; when it cannot, Warren runs
 * publish_run.py instead. WARREN_PURE_PYTHON=1 makes Warren ignore it
 * (publish_run.py decides).
 */
#include "_fastpath.h"

PyObject *plain_props[3];

static PyMethodDef module_methods[] = {
    {"scan_publishes", (PyCFunction)(void (*)(void))scan_publishes, METH_FASTCALL,
     "scan_publishes(data, pos, frame_max, max_body, limit, keyed=False) -> PublishRun | None"},
    {"scan_acks", (PyCFunction)(void (*)(void))scan_acks, METH_FASTCALL,
     "scan_acks(data, pos, max_n) -> (n, first_tag, end): a run of single basic.acks, "
     "rejects or nacks"},
    {"deliver_frames", (PyCFunction)(void (*)(void))deliver_frames, METH_FASTCALL,
     "deliver_frames(run, start, stop, step, channel, deliver_head, first_tag, frame_max) -> bytes"},
    {"encode_records", (PyCFunction)(void (*)(void))encode_records, METH_FASTCALL,
     "encode_records(run, start, stop, ex_rk, timestamp, base, seed=0) -> (records, offsets, sizes, persistent)"},
    {"encode_stream_records", (PyCFunction)(void (*)(void))encode_stream_records, METH_FASTCALL,
     "encode_stream_records(run, start, stop, ex_rk, timestamp, first_offset, seed) "
     "-> (records, ends) | None"},
    {"crc32", (PyCFunction)(void (*)(void))fp_crc32, METH_FASTCALL, "crc32(data, value=0) -> int"},
    {"crc_ok", (PyCFunction)(void (*)(void))fp_crc_ok, METH_FASTCALL,
     "crc_ok(buf, start, end, seed=0) -> bool: the CRC-32 stored at end matches buf[start:end]"},
    {"find_record", (PyCFunction)(void (*)(void))fp_find_record, METH_FASTCALL,
     "find_record(buf, start, limit, seed=0, marks=False) -> int: where a record checks out next"},
    {"scan_stream_deliveries", (PyCFunction)(void (*)(void))scan_stream_deliveries, METH_FASTCALL,
     "scan_stream_deliveries(buf, pos, start, last, first_seen, max_rows, max_bytes, columns) "
     "-> (pos, deliveries, tag, status, offset)"},
    {"encode_publishes", (PyCFunction)(void (*)(void))encode_publishes, METH_FASTCALL,
     "encode_publishes(data, ends, at, lo, hi, method, prefix, first_row, entry, persistent, "
     "frame_max) -> bytes"},
    {"deliver_records", (PyCFunction)(void (*)(void))deliver_records, METH_FASTCALL,
     "deliver_records(buf, pos, limit, seed, max_n, channel, deliver_head, first_tag, "
     "frame_max, redelivered=0, expired_at=-1, own_expiry=0, max_bytes=0) "
     "-> (frames, n, end, sizes, offsets)"},
    {"deliver_entries", (PyCFunction)(void (*)(void))deliver_entries, METH_FASTCALL,
     "deliver_entries(buf, pos, end, max_n, offset, ts, layouts, learn, channel, deliver_head, "
     "first_tag, frame_max, ex_rk, max_bytes=0) -> (frames, n, next, sizes)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "warren._fastpath",
    "The hot path's byte work in C (see warren/amqp/publish_run.py).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__fastpath(void) {
    static const char *plain[3] = {"\x00\x00", "\x10\x00\x01", "\x10\x00\x02"};
    static const Py_ssize_t plain_len[3] = {2, 3, 3};
    for (int i = 0; i < 3; i++) {
        if (plain_props[i] == NULL) {
            plain_props[i] = PyBytes_FromStringAndSize(plain[i], plain_len[i]);
            if (plain_props[i] == NULL) return NULL;
        }
    }
    crc_init();
    if (PyType_Ready(&PublishRunType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    Py_INCREF(&PublishRunType);
    if (PyModule_AddObject(m, "PublishRun", (PyObject *)&PublishRunType) < 0) {
        Py_DECREF(&PublishRunType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
