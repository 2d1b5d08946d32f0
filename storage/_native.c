/* The hot loops of a producer and a broker in C.
 *
 * Each has a numpy twin in Python that gives the same result (used where this
 * module is not built, and as its reference in the tests):
 *   encode_plain   storage/_fast_encode.py   a producer's plain batch
 *   scan_records   storage/codec.py          _headers_match, body_length_range
 *   verify_records storage/codec.py          EncodedBatch.check_structure (a client's batch)
 *   parse_send     storage/batch.py          EncodedBatch.from_bytes with its checks (a send)
 *   patch_records  storage/commitlog.py      the store fields of appended records
 *   link_index     storage/index_file.py     IndexFile._link_many
 *   body_slices    storage/codec.py          body_slices (a consumer's bodies)
 *   decode_records storage/record.py         decode_records (a pull's or a stream's records)
 *
 * encode_plain: a plain batch of storage.Message.
 *
 * storage/_fast_encode.py decides what "plain" means and keeps a numpy encoder
 * that gives the same bytes; this module is the same loop without the
 * interpreter: ~0.1 us a 100 B message against ~0.5-0.9 us for the numpy one,
 * most of which went to reading eight attributes per message in Python.
 *
 * encode_plain() reads each message's slots straight from the object (the
 * offsets of Message's member descriptors, taken once by bind()), checks the
 * batch is plain, then writes every record with the GIL released: header from
 * a template, body and its CRC, tail with the unique key, and each key's Java
 * hash. Anything not plain returns None and the caller takes the general path,
 * which names the error; so this module never raises on a message's content.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

typedef uint32_t (*crc_fn)(uint32_t, const unsigned char *, uint32_t);

/* The GIL is let go only around work long enough to be worth it. Letting it go hands
 * it to any thread that waits for it, and taking it back then waits for that thread
 * to give it up: up to the interpreter's switch interval (5 ms) if it runs Python.
 * For a single send's record (a microsecond of work) that is a stall out of all
 * proportion, on the thread a message is waiting on: a broker's event loop, a
 * producer's caller. Below RELEASE_GIL_BYTES of work the loops keep the GIL, as
 * CPython's own zlib.crc32 and hashlib do below a few KiB. */
#define RELEASE_GIL_BYTES (64 * 1024)
#define BEGIN_WORK(bytes)                                                               \
    {                                                                                   \
        PyThreadState *_work_save = (bytes) >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
#define END_WORK                                                                        \
    if (_work_save) PyEval_RestoreThread(_work_save);                                   \
    }

/* ------------------------------------------------------------------ CRC-32 */
/* IEEE CRC-32 (reflected 0xEDB88320), slicing by 8: the fallback when zlib-ng's
 * own function is not handed to us (it folds with carry-less multiplies). */
static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc_builtin(uint32_t crc, const unsigned char *p, uint32_t len) {
    crc = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
        len--;
    }
    while (len >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        lo = __builtin_bswap32(lo);
        hi = __builtin_bswap32(hi);
#endif
        lo ^= crc;
        crc = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
              crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
              crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
              crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--) crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
    return ~crc;
}

/* ------------------------------------------------------------------ Message's slots */
enum { F_TOPIC, F_BODY, F_TAGS, F_KEYS, F_PROPS, F_QID, F_FLAG, F_DELAY, N_FIELDS };
static const char *field_names[N_FIELDS] = {"topic", "body",     "tags", "keys",
                                            "properties", "queue_id", "flag", "delay_level"};
static PyTypeObject *bound_type = NULL;
static Py_ssize_t offsets[N_FIELDS];

#define SLOT(obj, f) (*(PyObject **)((char *)(obj) + offsets[f]))

static PyObject *bind(PyObject *self, PyObject *type) {
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "bind() takes the Message class");
        return NULL;
    }
    Py_ssize_t found[N_FIELDS];
    for (int f = 0; f < N_FIELDS; f++) {
        PyObject *d = PyObject_GetAttrString(type, field_names[f]);
        if (d == NULL) return NULL;
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                 ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
        if (ok) found[f] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", ((PyTypeObject *)type)->tp_name,
                         field_names[f]);
            return NULL;
        }
    }
    memcpy(offsets, found, sizeof offsets);
    Py_INCREF(type);
    Py_XSETREF(bound_type, (PyTypeObject *)type);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ helpers */
static inline void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* Python's truth test for the built-in types a Message's fields hold; -1 for any
 * other type (the batch is then not plain): a user type's __bool__ or __len__ could
 * run code that changes the list being read */
static inline int is_true(PyObject *v) {
    if (v == Py_None || v == Py_False) return 0;
    if (v == Py_True) return 1;
    if (PyLong_CheckExact(v)) return PyObject_IsTrue(v);
    if (PyTuple_CheckExact(v)) return PyTuple_GET_SIZE(v) != 0;
    if (PyList_CheckExact(v)) return PyList_GET_SIZE(v) != 0;
    if (PyDict_CheckExact(v)) return PyDict_GET_SIZE(v) != 0;
    if (PyUnicode_CheckExact(v)) return PyUnicode_GET_LENGTH(v) != 0;
    return -1;
}

/* text equality as ``!=`` decides it for str; anything else is not plain (-1) */
static inline int same_text(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    if (!PyUnicode_CheckExact(a) || !PyUnicode_CheckExact(b)) return -1;
    return PyUnicode_Compare(a, b) == 0;
}

static const char HEX[] = "0123456789ABCDEF";

#define HDR_LEN 88
#define FIXED_LEN 91 /* HDR_LEN + TOPICLEN (1) + PROPERTIESLEN (2) */
#define UNIQ_LEN 32
#define PREFIX_LEN 20

/* ------------------------------------------------------------------ encode_plain */
PyDoc_STRVAR(encode_plain_doc,
             "encode_plain(messages, topic, tags, max_size, header, head, prefix, start,\n"
             "             key_hash_base, crc_address) -> (data, sizes, queue_ids, key_hashes,\n"
             "             uniq_keys) or None\n\n"
             "``header``: the 88-byte record header with MAGIC, BORNTIMESTAMP and BORNHOST\n"
             "set; ``head``: the tail up to the unique key (topic section, PROPLEN, tags,\n"
             "'UNIQ_KEY\\x01'); ``prefix``: the key generator's 20 hex digits; ``start``: the\n"
             "first counter; ``key_hash_base``: java_hash(topic + '#' + prefix) as uint32;\n"
             "``crc_address``: zlib-ng's zng_crc32, or 0 for the built-in table. The arrays\n"
             "come back as native int32 bytes, the unique keys as one '\\x00'-separated bytes.\n"
             "None: the batch is not plain.\n\n"
             "``keyed`` (optional): every message has one key of its own, an ASCII str with no\n"
             "space or separator (or a list or tuple of that one str); ``head`` then ends after the tags (its PROPLEN is written\n"
             "per message), each record gets 'KEYS\\x01<key>\\x02' before its unique key, and\n"
             "``key_hashes`` holds two hashes a message, its key's (from ``key_topic_base``:\n"
             "java_hash(topic + '#') as uint32) then its unique key's.\n\n"
             "``slot`` (optional, bytes): a property ('name\\x01value\\x02') written after the\n"
             "first record's unique key, its PROPLEN and TOTALSIZE counting it (an idempotent\n"
             "producer's PRODUCER_SEQ, patched in place when the batch is bound: see\n"
             "storage.codec.EncodedBatch.with_sequence); ``data`` is then a bytearray.\n\n"
             "``extras`` (optional, a list of n bytes or None): per record, properties\n"
             "('name\\x01value\\x02' each) written after the head's shared ones (before\n"
             "'KEYS' or 'UNIQ_KEY'), its PROPLEN and TOTALSIZE counting them (a lite topic\n"
             "named per record, with the message's own properties, which the messages may\n"
             "then have); the head of an unkeyed batch then ends with 'UNIQ_KEY\\x01'.");

static PyObject *encode_plain(PyObject *self, PyObject *args) {
    PyObject *messages, *topic, *tags;
    Py_ssize_t max_size;
    Py_buffer header, head, prefix;
    unsigned long long start, crc_address;
    unsigned long key_hash_base, key_topic_base = 0;
    int keyed = 0;
    Py_buffer slot = {0};
    PyObject *extras_arg = Py_None;
    if (!PyArg_ParseTuple(args, "OOOny*y*y*KkK|pky*O", &messages, &topic, &tags, &max_size,
                          &header, &head, &prefix, &start, &key_hash_base, &crc_address, &keyed,
                          &key_topic_base, &slot, &extras_arg))
        return NULL;
    const Py_ssize_t slot_len = slot.buf != NULL ? slot.len : 0;
    PyObject *result = NULL;
    PyObject **items = NULL;
    PyObject *seq = NULL;
    const unsigned char **bodies = NULL;
    PyObject **owners = NULL; /* the bodies, held while the GIL is released */
    PyObject **key_owners = NULL; /* keyed: the keys, held likewise */
    const unsigned char **keys = NULL;
    uint32_t *key_lens = NULL;
    uint32_t *lens = NULL;
    int32_t *qids = NULL, *flags = NULL;
    PyObject *data = NULL, *sizes = NULL, *queue_ids = NULL, *key_hashes = NULL, *text = NULL;
    PyObject *extras = NULL; /* the per-record properties' list, held */
    const unsigned char **ex = NULL;
    uint32_t *ex_lens = NULL;
    Py_ssize_t n = 0, held = 0, keys_held = 0;

    if (bound_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind(Message) first");
        goto done;
    }
    if (header.len != HDR_LEN || prefix.len != PREFIX_LEN) {
        PyErr_SetString(PyExc_ValueError, "header must be 88 bytes and prefix 20");
        goto done;
    }
    if (slot_len > 0 && (head.len < 3 || ((const unsigned char *)head.buf)[0] + 3 > head.len)) {
        PyErr_SetString(PyExc_ValueError, "slot: head must start with the topic section");
        goto done;
    }
    seq = PySequence_Fast(messages, "messages must be a sequence");
    if (seq == NULL) goto done;
    n = PySequence_Fast_GET_SIZE(seq);
    items = PySequence_Fast_ITEMS(seq);
    if (n == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    bodies = PyMem_Malloc(n * sizeof *bodies);
    owners = PyMem_Malloc(n * sizeof *owners);
    lens = PyMem_Malloc(n * sizeof *lens);
    qids = PyMem_Malloc(n * sizeof *qids);
    flags = PyMem_Malloc(n * sizeof *flags);
    if (!bodies || !owners || !lens || !qids || !flags) {
        PyErr_NoMemory();
        goto done;
    }
    if (extras_arg != Py_None) {
        extras = PySequence_Fast(extras_arg, "extras must be a sequence of bytes");
        if (extras == NULL) goto done;
        if (PySequence_Fast_GET_SIZE(extras) != n) {
            PyErr_SetString(PyExc_ValueError, "extras: one bytes per message");
            goto done;
        }
        if (!keyed && (head.len < 9 || memcmp((const char *)head.buf + head.len - 9,
                                              "UNIQ_KEY\x01", 9) != 0)) {
            PyErr_SetString(PyExc_ValueError, "extras: head must end with 'UNIQ_KEY\\x01'");
            goto done;
        }
        ex = PyMem_Malloc(n * sizeof *ex);
        ex_lens = PyMem_Malloc(n * sizeof *ex_lens);
        if (!ex || !ex_lens) {
            PyErr_NoMemory();
            goto done;
        }
        PyObject **ex_items = PySequence_Fast_ITEMS(extras);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!PyBytes_CheckExact(ex_items[i])) {
                PyErr_SetString(PyExc_TypeError, "extras: bytes each");
                goto done;
            }
            ex[i] = (const unsigned char *)PyBytes_AS_STRING(ex_items[i]);
            ex_lens[i] = (uint32_t)PyBytes_GET_SIZE(ex_items[i]);
            if (ex_lens[i] > 32767) goto not_plain;
        }
    }
    if (keyed) {
        key_owners = PyMem_Malloc(n * sizeof *key_owners);
        keys = PyMem_Malloc(n * sizeof *keys);
        key_lens = PyMem_Malloc(n * sizeof *key_lens);
        if (!key_owners || !keys || !key_lens) {
            PyErr_NoMemory();
            goto done;
        }
        /* head: topic section, PROPLEN (written per record), tags part */
        if (head.len < 3 || ((const unsigned char *)head.buf)[0] + 3 > head.len) {
            PyErr_SetString(PyExc_ValueError, "keyed: head must be the topic section, "
                                              "PROPLEN and the tags part");
            goto done;
        }
    }

    /* pass 1, with the GIL: is the batch plain, and how long is it */
    /* keyed: 'KEYS' 0x01 key 0x02 'UNIQ_KEY' 0x01 uniq 0x02 after the head */
    const Py_ssize_t fixed = HDR_LEN + head.len + UNIQ_LEN + 1 + (keyed ? 5 + 1 + 9 : 0);
    const Py_ssize_t topic_section = keyed ? ((const unsigned char *)head.buf)[0] + 1 : 0;
    const Py_ssize_t props_base = keyed ? head.len - topic_section - 2 + 5 + 1 + 9 + UNIQ_LEN + 1 : 0;
    /* unkeyed: the properties the head's PROPLEN counts */
    const Py_ssize_t tsec0 = ((const unsigned char *)head.buf)[0] + 1;
    const Py_ssize_t head_props =
        !keyed && head.len >= tsec0 + 2
            ? (((const unsigned char *)head.buf)[tsec0] << 8) | ((const unsigned char *)head.buf)[tsec0 + 1]
            : 0;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = items[i];
        if (Py_TYPE(m) != bound_type) goto not_plain;
        PyObject *v[N_FIELDS];
        for (int f = 0; f < N_FIELDS; f++) {
            v[f] = SLOT(m, f);
            if (v[f] == NULL) goto not_plain; /* an unset slot: let Python say so */
        }
        if (same_text(v[F_TOPIC], topic) != 1) goto not_plain;
        if (tags == Py_None ? v[F_TAGS] != Py_None : same_text(v[F_TAGS], tags) != 1)
            goto not_plain;
        /* with extras, a message's own properties are the caller's to write there */
        if ((ex == NULL && is_true(v[F_PROPS]) != 0) || is_true(v[F_DELAY]) != 0) goto not_plain;
        Py_ssize_t klen = 0;
        if (!keyed) {
            if (is_true(v[F_KEYS]) != 0) goto not_plain;
        } else {
            /* one key: an ASCII str, not empty, no space and no separator; given as
             * the str or as a list or tuple of it alone (Message(keys=[order_id])) */
            PyObject *key = v[F_KEYS];
            if ((PyList_CheckExact(key) || PyTuple_CheckExact(key)) &&
                PySequence_Fast_GET_SIZE(key) == 1)
                key = PySequence_Fast_GET_ITEM(key, 0);
            if (!PyUnicode_CheckExact(key) || !PyUnicode_IS_ASCII(key)) goto not_plain;
            klen = PyUnicode_GET_LENGTH(key);
            if (klen == 0 || props_base + klen > 32767) goto not_plain;
            const unsigned char *kc = PyUnicode_1BYTE_DATA(key);
            for (Py_ssize_t c = 0; c < klen; c++)
                if (kc[c] == ' ' || kc[c] == 1 || kc[c] == 2) goto not_plain;
            key_owners[i] = Py_NewRef(key);
            keys_held = i + 1;
            keys[i] = kc;
            key_lens[i] = (uint32_t)klen;
        }
        PyObject *body = v[F_BODY];
        if (!PyBytes_CheckExact(body)) goto not_plain;
        Py_ssize_t blen = PyBytes_GET_SIZE(body);
        if (blen == 0 || blen > max_size) goto not_plain;
        PyObject *q = v[F_QID], *fl = v[F_FLAG];
        if (!PyLong_CheckExact(q) || !PyLong_CheckExact(fl)) goto not_plain;
        int overflow;
        long qv = PyLong_AsLongAndOverflow(q, &overflow);
        if (overflow || qv < 0 || qv > 0x7FFFFFFFL) goto not_plain;
        long fv = PyLong_AsLongAndOverflow(fl, &overflow);
        if (overflow || fv < INT32_MIN || fv > INT32_MAX) goto not_plain;
        const Py_ssize_t exl = ex != NULL ? ex_lens[i] : 0;
        if (exl && (keyed ? props_base + klen : head_props) + exl > 32767) goto not_plain;
        if (fixed + blen + klen + exl > INT32_MAX) goto not_plain;
        owners[i] = Py_NewRef(body);
        held = i + 1;
        bodies[i] = (const unsigned char *)PyBytes_AS_STRING(body);
        lens[i] = (uint32_t)blen;
        qids[i] = (int32_t)qv;
        flags[i] = (int32_t)fv;
        total += fixed + blen + klen + exl;
    }
    if (slot_len > 0) {
        /* the first record's properties with the slot must still fit PROPLEN's 15 bits */
        const Py_ssize_t tsec = ((const unsigned char *)head.buf)[0] + 1;
        const Py_ssize_t ex0 = ex != NULL ? ex_lens[0] : 0;
        const Py_ssize_t props0 =
            (keyed ? props_base + key_lens[0] : head.len - tsec - 2 + UNIQ_LEN + 1) + ex0;
        if (props0 + slot_len > 32767 ||
            fixed + lens[0] + (keyed ? key_lens[0] : 0) + ex0 + slot_len > INT32_MAX)
            goto not_plain;
        total += slot_len;
    }

    data = slot_len > 0 ? PyByteArray_FromStringAndSize(NULL, total)
                        : PyBytes_FromStringAndSize(NULL, total);
    sizes = PyBytes_FromStringAndSize(NULL, n * 4);
    queue_ids = PyBytes_FromStringAndSize(NULL, n * 4);
    key_hashes = PyBytes_FromStringAndSize(NULL, n * (keyed ? 8 : 4));
    text = PyBytes_FromStringAndSize(NULL, n * (UNIQ_LEN + 1) - 1);
    if (!data || !sizes || !queue_ids || !key_hashes || !text) goto fail;

    /* pass 2, without the GIL: the bytes (the bodies are held above) */
    {
        unsigned char *out = slot_len > 0 ? (unsigned char *)PyByteArray_AS_STRING(data)
                                          : (unsigned char *)PyBytes_AS_STRING(data);
        const unsigned char *slot_bytes = slot.buf;
        const Py_ssize_t slot_at = ((const unsigned char *)head.buf)[0] + 1; /* PROPLEN */
        int32_t *size_out = (int32_t *)PyBytes_AS_STRING(sizes);
        int32_t *hash_out = (int32_t *)PyBytes_AS_STRING(key_hashes);
        unsigned char *text_out = (unsigned char *)PyBytes_AS_STRING(text);
        const unsigned char *hdr = header.buf, *hd = head.buf, *pre = prefix.buf;
        const Py_ssize_t head_len = head.len;
        crc_fn crc = crc_address ? (crc_fn)(uintptr_t)crc_address : crc_builtin;
        memcpy(PyBytes_AS_STRING(queue_ids), qids, n * 4);
        BEGIN_WORK(total)
        for (Py_ssize_t i = 0; i < n; i++) {
            const uint32_t blen = lens[i];
            const uint32_t klen = keyed ? key_lens[i] : 0;
            const uint32_t extra = i == 0 ? (uint32_t)slot_len : 0;
            const uint32_t exl = ex != NULL ? ex_lens[i] : 0;
            const uint32_t size = (uint32_t)fixed + blen + klen + extra + exl;
            unsigned char *r = out;
            memcpy(r, hdr, HDR_LEN);
            put_be32(r, size);
            put_be32(r + 8, crc(0, bodies[i], blen) & 0x7FFFFFFFu);
            put_be32(r + 12, (uint32_t)qids[i]);
            put_be32(r + 16, (uint32_t)flags[i]);
            put_be32(r + 84, blen);
            r += HDR_LEN;
            memcpy(r, bodies[i], blen);
            r += blen;
            /* the record's own properties (extras) go after the head's shared ones:
             * an unkeyed head's 'UNIQ_KEY\x01' (its last 9 bytes) follows them */
            const Py_ssize_t cut = (ex != NULL && !keyed) ? head_len - 9 : head_len;
            memcpy(r, hd, cut);
            if (exl) memcpy(r + cut, ex[i], exl);
            if (cut < head_len) memcpy(r + cut + exl, hd + cut, head_len - cut);
            if (keyed) {
                const uint32_t props = (uint32_t)props_base + klen + extra + exl;
                r[topic_section] = (unsigned char)(props >> 8);
                r[topic_section + 1] = (unsigned char)props;
            } else if (extra || exl) {
                const uint32_t props =
                    (((uint32_t)r[slot_at] << 8) | r[slot_at + 1]) + extra + exl;
                r[slot_at] = (unsigned char)(props >> 8);
                r[slot_at + 1] = (unsigned char)props;
            }
            r += head_len + exl;
            if (keyed) {
                memcpy(r, "KEYS\x01", 5);
                memcpy(r + 5, keys[i], klen);
                r[5 + klen] = 2;
                memcpy(r + 6 + klen, "UNIQ_KEY\x01", 9);
                r += 15 + klen;
                /* java_hash("topic#" + key), from java_hash("topic#") */
                uint32_t kh = (uint32_t)key_topic_base;
                for (uint32_t c = 0; c < klen; c++) kh = kh * 31u + keys[i][c];
                hash_out[2 * i] = (int32_t)kh;
            }
            /* the unique key: the prefix, then 12 hex digits of the 48-bit counter */
            unsigned char *key = r;
            memcpy(key, pre, PREFIX_LEN);
            uint64_t c = (start + (uint64_t)i) & 0xFFFFFFFFFFFFull;
            for (int d = 11; d >= 0; d--) {
                key[PREFIX_LEN + d] = (unsigned char)HEX[c & 0xF];
                c >>= 4;
            }
            r[UNIQ_LEN] = 2;
            if (extra) memcpy(r + UNIQ_LEN + 1, slot_bytes, extra);
            /* java_hash("topic#" + key) = java_hash("topic#" + prefix) * 31**12 + digits' */
            uint32_t h = (uint32_t)key_hash_base;
            for (int d = 0; d < 12; d++) h = h * 31u + key[PREFIX_LEN + d];
            hash_out[keyed ? 2 * i + 1 : i] = (int32_t)h;
            size_out[i] = (int32_t)size;
            memcpy(text_out, key, UNIQ_LEN);
            if (i + 1 < n) text_out[UNIQ_LEN] = 0;
            text_out += UNIQ_LEN + 1;
            out += size;
        }
        END_WORK
    }
    result = PyTuple_Pack(5, data, sizes, queue_ids, key_hashes, text);
    goto done;

not_plain:
    result = Py_NewRef(Py_None);
    goto done;
fail:
    result = NULL;
done:
    for (Py_ssize_t i = 0; i < held; i++) Py_DECREF(owners[i]);
    for (Py_ssize_t i = 0; i < keys_held; i++) Py_DECREF(key_owners[i]);
    PyMem_Free(key_owners);
    PyMem_Free(keys);
    PyMem_Free(key_lens);
    PyMem_Free(ex);
    PyMem_Free(ex_lens);
    Py_XDECREF(extras);
    Py_XDECREF(data);
    Py_XDECREF(sizes);
    Py_XDECREF(queue_ids);
    Py_XDECREF(key_hashes);
    Py_XDECREF(text);
    Py_XDECREF(seq);
    PyMem_Free(bodies);
    PyMem_Free(owners);
    PyMem_Free(lens);
    PyMem_Free(qids);
    PyMem_Free(flags);
    PyBuffer_Release(&header);
    PyBuffer_Release(&head);
    PyBuffer_Release(&prefix);
    if (slot.buf != NULL) PyBuffer_Release(&slot);
    return result;
}

/* ------------------------------------------------------------------ the broker's loops */
static inline uint32_t get_be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline void put_be64(unsigned char *p, uint64_t v) {
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

/* a C-contiguous buffer of ``count`` items of ``itemsize`` bytes, or an error */
static int get_array(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable,
                     const char *what) {
    if (PyObject_GetBuffer(obj, view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->len % itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of %zd-byte items",
                     what, view->len, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(scan_records_doc,
             "scan_records(data, sizes) -> (min_body, max_body) or None\n\n"
             "Walk the records laid back to back with ``sizes`` (native int32): None unless\n"
             "each starts with its size and MAGIC and holds a BODYLEN; else the range of\n"
             "BODYLEN. ``sizes`` must be non-empty.");

static PyObject *scan_records(PyObject *self, PyObject *args) {
    PyObject *data_obj, *sizes_obj;
    if (!PyArg_ParseTuple(args, "OO", &data_obj, &sizes_obj)) return NULL;
    Py_buffer data, sizes;
    if (get_array(data_obj, &data, 1, 0, "data") < 0) return NULL;
    if (get_array(sizes_obj, &sizes, 4, 0, "sizes") < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    const unsigned char *buf = data.buf, *sz = sizes.buf;
    const Py_ssize_t n = sizes.len / 4, len = data.len;
    int ok = n > 0;
    int32_t lo = INT32_MAX, hi = INT32_MIN;
    BEGIN_WORK(len)
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        int32_t size;
        memcpy(&size, sz + 4 * i, 4);
        if (size < HDR_LEN || pos > len - HDR_LEN || (int32_t)get_be32(buf + pos) != size ||
            get_be32(buf + pos + 4) != 0xDAA320A7u) {
            ok = 0;
            break;
        }
        int32_t body = (int32_t)get_be32(buf + pos + 84);
        if (body < lo) lo = body;
        if (body > hi) hi = body;
        pos += size;
    }
    END_WORK
    PyBuffer_Release(&data);
    PyBuffer_Release(&sizes);
    if (!ok) Py_RETURN_NONE;
    return Py_BuildValue("ii", lo, hi);
}

/* Python's strict UTF-8 (no overlongs, no surrogates, nothing past U+10FFFF):
 * the offset of the first byte that breaks it, or -1. ASCII runs go 8 bytes a step. */
static Py_ssize_t utf8_fault(const unsigned char *p, Py_ssize_t len) {
    Py_ssize_t i = 0;
    while (i < len) {
        if (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        const unsigned char c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        Py_ssize_t need;
        unsigned char lo = 0x80, hi = 0xBF; /* the range of the second byte */
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return i;
        }
        if (i + need >= len) return i; /* cut short */
        if (p[i + 1] < lo || p[i + 1] > hi) return i;
        for (Py_ssize_t k = 2; k <= need; k++)
            if ((p[i + k] & 0xC0) != 0x80) return i;
        i += need + 1;
    }
    return -1;
}

/* an idempotent producer's mark: a pair of this name (storage.codec.seq_pairs) */
static const char SEQ_NAME[] = "PRODUCER_SEQ\x01";
#define SEQ_NAME_LEN ((Py_ssize_t)(sizeof SEQ_NAME - 1))

/* properties as decode_properties reads them: UTF-8, each non-empty pair (pairs end
 * with \x02) holding a \x01; the offset of the fault, or -1. Adds to ``*seq_pairs``
 * the pairs named PRODUCER_SEQ (their names, from a pair's start, are compared while
 * the pairs are walked anyway: the broker counts them at no extra pass). */
static Py_ssize_t properties_fault(const unsigned char *p, Py_ssize_t len, Py_ssize_t *seq_pairs) {
    Py_ssize_t bad = utf8_fault(p, len);
    if (bad >= 0) return bad;
    Py_ssize_t pair = 0, named = 0;
    while (pair < len) {
        const unsigned char *end = memchr(p + pair, 2, len - pair);
        const Py_ssize_t stop = end ? end - p : len;
        if (stop > pair && !memchr(p + pair, 1, stop - pair)) return pair;
        named += p[pair] == 'P' && stop - pair >= SEQ_NAME_LEN &&
                 memcmp(p + pair, SEQ_NAME, SEQ_NAME_LEN) == 0;
        pair = stop + 1;
    }
    *seq_pairs += named;
    return -1;
}

enum {
    V_OK = -1,
    V_TOTALSIZE,
    V_MAGIC,
    V_BODYLEN,
    V_TOPICLEN,
    V_PROPERTIESLEN,
    V_TOPIC,
    V_SYSFLAG,
    V_PROPERTIES,
    V_BODYCRC,
};
static const char *verify_fields[] = {"TOTALSIZE", "MAGIC",      "BODYLEN",    "TOPICLEN", "PROPERTIESLEN",
                                      "TOPIC",     "SYSFLAG",    "PROPERTIES", "BODYCRC"};

/* What verify_loop found: ``bad`` -1 when every record holds, else the first that
 * does not (n when the records stop short of the data), ``field`` (V_*) what broke,
 * ``value``/``expected`` what it held and should have; the BODYLEN range of the records
 * checked and how many PRODUCER_SEQ pairs they hold. */
typedef struct {
    Py_ssize_t bad;
    int field;
    long long value, expected;
    int32_t lo, hi;
    Py_ssize_t seq_pairs;
} verdict;

/* verify_records' walk: the records laid back to back in buf[0:len] with n sizes
 * (native int32 at sz) and topic indexes (native int16 at ix) into names/name_lens. */
static void verify_loop(const unsigned char *buf, Py_ssize_t len, const unsigned char *sz,
                        const unsigned char *ix, Py_ssize_t n, const unsigned char **names,
                        const Py_ssize_t *name_lens, Py_ssize_t ntopics, uint32_t sysflags,
                        crc_fn crc, verdict *v) {
    Py_ssize_t bad = -1;
    int field = V_OK;
    long long value = 0, expected = 0;
    int32_t lo = INT32_MAX, hi = INT32_MIN;
    Py_ssize_t seq_pairs = 0;
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t size;
        int16_t t;
        memcpy(&size, sz + 4 * i, 4);
        memcpy(&t, ix + 2 * i, 2);
        const unsigned char *r = buf + pos;
        bad = i;
        if (size < FIXED_LEN || size > len - pos) {
            field = V_TOTALSIZE, value = size, expected = len - pos;
            break;
        }
        if ((int32_t)get_be32(r) != size) {
            field = V_TOTALSIZE, value = (int32_t)get_be32(r), expected = size;
            break;
        }
        if (get_be32(r + 4) != 0xDAA320A7u) {
            field = V_MAGIC, value = get_be32(r + 4), expected = 0xDAA320A7u;
            break;
        }
        const int32_t body = (int32_t)get_be32(r + 84);
        if (body < 0 || body > size - FIXED_LEN) {
            field = V_BODYLEN, value = body, expected = size - FIXED_LEN;
            break;
        }
        const unsigned char *tp = r + HDR_LEN + body;
        const int32_t topic_len = tp[0];
        if (t < 0 || t >= ntopics || topic_len != name_lens[t]) {
            field = V_TOPICLEN, value = topic_len;
            expected = (t >= 0 && t < ntopics) ? name_lens[t] : -1;
            break;
        }
        const unsigned char *pp = tp + 1 + topic_len;
        const int32_t prop_len = (pp[0] << 8) | pp[1];
        if (FIXED_LEN + body + topic_len + prop_len != size) {
            field = V_PROPERTIESLEN, value = prop_len;
            expected = size - FIXED_LEN - body - topic_len;
            break;
        }
        if (memcmp(tp + 1, names[t], topic_len) != 0) {
            field = V_TOPIC;
            break;
        }
        const uint32_t flags = get_be32(r + 36);
        if (flags & ~sysflags) {
            field = V_SYSFLAG, value = flags, expected = flags & sysflags;
            break;
        }
        const Py_ssize_t fault = properties_fault(pp + 2, prop_len, &seq_pairs);
        if (fault >= 0) {
            field = V_PROPERTIES, value = fault, expected = prop_len;
            break;
        }
        const uint32_t want = crc(0, r + HDR_LEN, (uint32_t)body) & 0x7FFFFFFFu;
        if (get_be32(r + 8) != want) {
            field = V_BODYCRC, value = (int32_t)get_be32(r + 8), expected = want;
            break;
        }
        if (body < lo) lo = body;
        if (body > hi) hi = body;
        pos += size;
        bad = -1;
    }
    if (bad < 0 && pos != len) field = V_TOTALSIZE, bad = n, value = pos, expected = len;
    v->bad = bad, v->field = field, v->value = value, v->expected = expected;
    v->lo = lo, v->hi = hi, v->seq_pairs = seq_pairs;
}

PyDoc_STRVAR(verify_records_doc,
             "verify_records(data, sizes, topic_idx, topics, sysflags, crc_address)\n"
             "    -> (bad, field, value, expected, min_body, max_body, seq_pairs)\n\n"
             "Check each record laid back to back with ``sizes`` (native int32) as the store\n"
             "will trust it: TOTALSIZE and MAGIC, BODYLEN, TOPICLEN and PROPERTIESLEN adding\n"
             "up to TOTALSIZE, the topic equal to ``topics[topic_idx[i]]`` (bytes; int16\n"
             "indexes), no SYSFLAG bit outside ``sysflags``, the properties as\n"
             "decode_properties reads them, BODYCRC (zlib-ng's zng_crc32 at ``crc_address``,\n"
             "or 0 for the built-in table). ``bad`` is -1 when every record holds, else the\n"
             "first record that does not, ``field`` what broke, ``value`` and ``expected``\n"
             "what it held and should have (TOPIC: 0, 0; PROPERTIES: the offset in them).\n"
             "``min_body``/``max_body``: the range of BODYLEN of the records checked;\n"
             "``seq_pairs``: how many properties named PRODUCER_SEQ they hold, in all.");

static PyObject *verify_records(PyObject *self, PyObject *args) {
    PyObject *data_obj, *sizes_obj, *idx_obj, *topics;
    unsigned long sysflags;
    unsigned long long crc_address;
    if (!PyArg_ParseTuple(args, "OOOO!kK", &data_obj, &sizes_obj, &idx_obj, &PyTuple_Type,
                          &topics, &sysflags, &crc_address))
        return NULL;
    Py_buffer data = {0}, sizes = {0}, idx = {0};
    PyObject *result = NULL;
    const unsigned char **names = NULL;
    Py_ssize_t *name_lens = NULL;
    if (get_array(data_obj, &data, 1, 0, "data") < 0) return NULL;
    if (get_array(sizes_obj, &sizes, 4, 0, "sizes") < 0) goto done;
    if (get_array(idx_obj, &idx, 2, 0, "topic_idx") < 0) goto done;
    const Py_ssize_t n = sizes.len / 4, ntopics = PyTuple_GET_SIZE(topics);
    if (idx.len / 2 != n) {
        PyErr_SetString(PyExc_ValueError, "sizes and topic_idx differ in length");
        goto done;
    }
    names = PyMem_Malloc((ntopics + 1) * sizeof *names);
    name_lens = PyMem_Malloc((ntopics + 1) * sizeof *name_lens);
    if (!names || !name_lens) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t t = 0; t < ntopics; t++) {
        PyObject *name = PyTuple_GET_ITEM(topics, t);
        if (!PyBytes_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "topics must be a tuple of bytes");
            goto done;
        }
        names[t] = (const unsigned char *)PyBytes_AS_STRING(name);
        name_lens[t] = PyBytes_GET_SIZE(name);
    }
    crc_fn crc = crc_address ? (crc_fn)(uintptr_t)crc_address : crc_builtin;
    verdict v;
    BEGIN_WORK(data.len)
    verify_loop(data.buf, data.len, sizes.buf, idx.buf, n, names, name_lens, ntopics,
                (uint32_t)sysflags, crc, &v);
    END_WORK
    const Py_ssize_t bad = v.bad;
    const int field = v.field;
    const long long value = v.value, expected = v.expected;
    const int32_t lo = v.lo, hi = v.hi;
    const Py_ssize_t seq_pairs = v.seq_pairs;
    if (bad < 0)
        result = Py_BuildValue("nOLLiin", bad, Py_None, value, expected, lo, hi, seq_pairs);
    else
        result = Py_BuildValue("nsLLiin", bad, verify_fields[field], value, expected, lo, hi,
                               seq_pairs);
done:
    PyMem_Free(names);
    PyMem_Free(name_lens);
    PyBuffer_Release(&data);
    if (sizes.obj) PyBuffer_Release(&sizes);
    if (idx.obj) PyBuffer_Release(&idx);
    return result;
}

PyDoc_STRVAR(patch_records_doc,
             "patch_records(buffer, at, sizes, queue_ids, queue_offsets, phys, stored)\n\n"
             "Write QUEUEID, QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP + STOREHOST\n"
             "(``stored``, 16 bytes) into the records laid back to back in the writable\n"
             "``buffer`` from ``at``: sizes and queue ids native int32, offsets int64.\n"
             "Checks every record lies inside the buffer before writing any.");

static PyObject *patch_records(PyObject *self, PyObject *args) {
    PyObject *buf_obj, *sizes_obj, *qids_obj, *qoffs_obj, *phys_obj;
    Py_ssize_t at;
    Py_buffer stored;
    if (!PyArg_ParseTuple(args, "OnOOOOy*", &buf_obj, &at, &sizes_obj, &qids_obj, &qoffs_obj,
                          &phys_obj, &stored))
        return NULL;
    Py_buffer buf = {0}, sizes = {0}, qids = {0}, qoffs = {0}, phys = {0};
    PyObject *result = NULL;
    if (stored.len != 16) {
        PyErr_SetString(PyExc_ValueError, "stored must be 16 bytes");
        goto out;
    }
    if (get_array(buf_obj, &buf, 1, 1, "buffer") < 0) goto out;
    if (get_array(sizes_obj, &sizes, 4, 0, "sizes") < 0) goto out;
    if (get_array(qids_obj, &qids, 4, 0, "queue_ids") < 0) goto out;
    if (get_array(qoffs_obj, &qoffs, 8, 0, "queue_offsets") < 0) goto out;
    if (get_array(phys_obj, &phys, 8, 0, "phys") < 0) goto out;
    const Py_ssize_t n = sizes.len / 4;
    if (qids.len / 4 != n || qoffs.len / 8 != n || phys.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "per-record arrays differ in length");
        goto out;
    }
    const unsigned char *sz = sizes.buf;
    Py_ssize_t end = at;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t size;
        memcpy(&size, sz + 4 * i, 4);
        if (size < HDR_LEN) {
            PyErr_SetString(PyExc_ValueError, "a record shorter than its header");
            goto out;
        }
        end += size;
    }
    if (at < 0 || end > buf.len) {
        PyErr_SetString(PyExc_ValueError, "records past the end of the buffer");
        goto out;
    }
    {
        unsigned char *base = buf.buf;
        const unsigned char *q = qids.buf, *qo = qoffs.buf, *ph = phys.buf, *st = stored.buf;
        BEGIN_WORK(end - at)
        Py_ssize_t pos = at;
        for (Py_ssize_t i = 0; i < n; i++) {
            unsigned char *r = base + pos;
            int32_t size, qid;
            int64_t qoff, off;
            memcpy(&size, sz + 4 * i, 4);
            memcpy(&qid, q + 4 * i, 4);
            memcpy(&qoff, qo + 8 * i, 8);
            memcpy(&off, ph + 8 * i, 8);
            put_be32(r + 12, (uint32_t)qid);
            put_be64(r + 20, (uint64_t)qoff);
            put_be64(r + 28, (uint64_t)off);
            memcpy(r + 56, st, 16);
            pos += size;
        }
        END_WORK
    }
    result = Py_NewRef(Py_None);
out:
    if (buf.obj) PyBuffer_Release(&buf);
    if (sizes.obj) PyBuffer_Release(&sizes);
    if (qids.obj) PyBuffer_Release(&qids);
    if (qoffs.obj) PyBuffer_Release(&qoffs);
    if (phys.obj) PyBuffer_Release(&phys);
    PyBuffer_Release(&stored);
    return result;
}

PyDoc_STRVAR(link_index_doc,
             "link_index(buffer, table_at, slots, entries_at, count, hashes, offsets, diff)\n"
             "    -> new_slots\n\n"
             "IndexFile entries for ``hashes`` (non-negative, native int64) at commitlog\n"
             "``offsets`` (int64), numbered from ``count``, written into the writable\n"
             "``buffer`` from ``entries_at`` (20 bytes each, big-endian). Each becomes the\n"
             "head of its slot in the big-endian int32 table of ``slots`` at ``table_at``\n"
             "and points at the head before it (a head not in 1..count-1 is none: 0). An\n"
             "entry is written before its slot is, so a crash never leaves a slot pointing\n"
             "at an unwritten entry. Returns how many slots were empty before.");

/* an open-addressing map slot -> newest entry of this batch, sized for the batch */
typedef struct {
    int64_t key; /* slot + 1; 0 = free */
    int64_t value;
} link_cell;

#define LINK_AHEAD 12

static PyObject *link_index(PyObject *self, PyObject *args) {
    PyObject *buf_obj, *hashes_obj, *offsets_obj;
    Py_ssize_t table_at, slots, entries_at;
    long long count;
    int diff;
    if (!PyArg_ParseTuple(args, "OnnnLOOi", &buf_obj, &table_at, &slots, &entries_at, &count,
                          &hashes_obj, &offsets_obj, &diff))
        return NULL;
    Py_buffer buf = {0}, hashes = {0}, offsets = {0};
    PyObject *result = NULL;
    link_cell *cells = NULL;
    if (get_array(buf_obj, &buf, 1, 1, "buffer") < 0) goto out;
    if (get_array(hashes_obj, &hashes, 8, 0, "hashes") < 0) goto out;
    if (get_array(offsets_obj, &offsets, 8, 0, "offsets") < 0) goto out;
    const Py_ssize_t n = hashes.len / 8;
    if (offsets.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "hashes and offsets differ in length");
        goto out;
    }
    if (slots <= 0 || table_at < 0 || entries_at < 0 || table_at > buf.len - 4 * slots ||
        entries_at > buf.len - 20 * n) {
        PyErr_SetString(PyExc_ValueError, "slot table or entries past the end of the buffer");
        goto out;
    }
    size_t cap = 16;
    while (cap < (size_t)n * 2) cap <<= 1;
    cells = PyMem_Calloc(cap, sizeof *cells);
    if (!cells) {
        PyErr_NoMemory();
        goto out;
    }
    long long fresh = 0;
    {
        unsigned char *tb = (unsigned char *)buf.buf + table_at;
        unsigned char *e = (unsigned char *)buf.buf + entries_at;
        const unsigned char *hs = hashes.buf, *os = offsets.buf;
        BEGIN_WORK(n * 64) /* an entry: a cache line of the table, 20 bytes written */
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t h, off;
            if (i + LINK_AHEAD < n) { /* the table is megabytes: fetch a later slot's line now */
                int64_t later;
                memcpy(&later, hs + 8 * (i + LINK_AHEAD), 8);
                later %= slots;
                __builtin_prefetch(tb + 4 * (later < 0 ? later + slots : later), 1);
            }
            memcpy(&h, hs + 8 * i, 8);
            memcpy(&off, os + 8 * i, 8);
            int64_t slot = h % slots;
            if (slot < 0) slot += slots;
            const int64_t number = count + i;
            size_t c = ((uint64_t)slot * 0x9E3779B97F4A7C15ull) >> 20 & (cap - 1);
            while (cells[c].key && cells[c].key != slot + 1) c = (c + 1) & (cap - 1);
            int64_t prev;
            if (cells[c].key) {
                prev = cells[c].value;
            } else {
                prev = (int32_t)get_be32(tb + 4 * slot);
                if (prev <= 0 || prev >= count) prev = 0;
                if (prev == 0) fresh++;
                cells[c].key = slot + 1;
            }
            cells[c].value = number;
            put_be32(e, (uint32_t)h);
            put_be64(e + 4, (uint64_t)off);
            put_be32(e + 12, (uint32_t)diff);
            put_be32(e + 16, (uint32_t)prev);
            e += 20;
            __asm__ __volatile__("" ::: "memory"); /* the entry, then the slot */
            put_be32(tb + 4 * slot, (uint32_t)number);
        }
        END_WORK
    }
    result = PyLong_FromLongLong(fresh);
out:
    PyMem_Free(cells);
    if (buf.obj) PyBuffer_Release(&buf);
    if (hashes.obj) PyBuffer_Release(&hashes);
    if (offsets.obj) PyBuffer_Release(&offsets);
    return result;
}

PyDoc_STRVAR(body_slices_doc,
             "body_slices(data, starts) -> list[bytes] or None\n\n"
             "The bodies of the records stored at ``starts`` (native int64) in ``data``,\n"
             "each a new bytes. None when a record's MAGIC, size or BODYLEN does not hold\n"
             "(the caller names the error).");

static PyObject *body_slices(PyObject *self, PyObject *args) {
    PyObject *data_obj, *starts_obj;
    if (!PyArg_ParseTuple(args, "OO", &data_obj, &starts_obj)) return NULL;
    Py_buffer data, starts;
    if (get_array(data_obj, &data, 1, 0, "data") < 0) return NULL;
    if (get_array(starts_obj, &starts, 8, 0, "starts") < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    const unsigned char *buf = data.buf, *st = starts.buf;
    const Py_ssize_t n = starts.len / 8, len = data.len;
    PyObject *out = PyList_New(n);
    if (out == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t at;
        memcpy(&at, st + 8 * i, 8);
        if (at < 0 || at > len - HDR_LEN || get_be32(buf + at + 4) != 0xDAA320A7u) goto bad;
        const int32_t size = (int32_t)get_be32(buf + at);
        const int32_t body = (int32_t)get_be32(buf + at + 84);
        if (body < 0 || (int64_t)HDR_LEN + body > size || at + HDR_LEN + body > len) goto bad;
        PyObject *b = PyBytes_FromStringAndSize((const char *)buf + at + HDR_LEN, body);
        if (b == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, b);
    }
    goto done;
bad:
    Py_CLEAR(out);
    out = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    return out;
}

PyDoc_STRVAR(decode_records_doc,
             "decode_records(data, message_type, check_crc, crc_address) -> list or None\n\n"
             "The records stored back to back in ``data``, each a ``message_type`` (a tuple\n"
             "subclass of 16 fields: storage.message.MessageExt) as\n"
             "storage.record.decode_records makes them, its properties left unparsed. None\n"
             "when any record breaks a rule that function checks (the caller's path names\n"
             "it); ``crc_address`` as encode_plain's.");

/* "a.b.c.d:port" of a record's 8-byte host (IPv4, big-endian port) */
static PyObject *host_str(const unsigned char *h) {
    return PyUnicode_FromFormat("%u.%u.%u.%u:%lu", h[0], h[1], h[2], h[3],
                                (unsigned long)get_be32(h + 4));
}

static inline uint64_t get_be64(const unsigned char *p) {
    return ((uint64_t)get_be32(p) << 32) | get_be32(p + 4);
}

static PyObject *decode_records(PyObject *self, PyObject *args) {
    PyObject *data_obj;
    PyTypeObject *type;
    int check_crc;
    unsigned long long crc_address;
    if (!PyArg_ParseTuple(args, "OO!pK", &data_obj, &PyType_Type, &type, &check_crc,
                          &crc_address))
        return NULL;
    if (!PyType_IsSubtype(type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "message_type must be a tuple subclass");
        return NULL;
    }
    Py_buffer data;
    if (get_array(data_obj, &data, 1, 0, "data") < 0) return NULL;
    const unsigned char *buf = data.buf;
    const Py_ssize_t len = data.len;
    crc_fn crc = crc_address ? (crc_fn)(uintptr_t)crc_address : crc_builtin;
    PyObject *out = PyList_New(0);
    /* the topic and hosts of the last record: a pull's records share them */
    PyObject *topic = NULL, *born = NULL, *stored = NULL;
    const unsigned char *topic_raw = NULL, *born_raw = NULL, *stored_raw = NULL;
    Py_ssize_t topic_len_last = -1;
    if (out == NULL) goto done;
    Py_ssize_t pos = 0;
    while (pos < len) {
        if (len - pos < HDR_LEN) goto bad;
        const unsigned char *r = buf + pos;
        const int32_t size = (int32_t)get_be32(r);
        if (get_be32(r + 4) != 0xDAA320A7u) goto bad;
        if (size < FIXED_LEN || size > len - pos) goto bad;
        const int32_t body_len = (int32_t)get_be32(r + 84);
        if (body_len < 0 || (int64_t)HDR_LEN + body_len + 3 > size) goto bad;
        const int32_t sys_flag = (int32_t)get_be32(r + 36);
        if (sys_flag & 0x30) goto bad;
        const unsigned char *body = r + HDR_LEN;
        const unsigned char *t = body + body_len;
        const Py_ssize_t topic_len = t[0];
        const unsigned char *end = r + size;
        if (topic_len > 127 || t + 1 + topic_len + 2 > end) goto bad;
        const unsigned char *pl = t + 1 + topic_len;
        const Py_ssize_t prop_len = ((Py_ssize_t)pl[0] << 8) | pl[1];
        if (pl + 2 + prop_len != end) goto bad;
        const int32_t body_crc = (int32_t)get_be32(r + 8);
        if (check_crc &&
            (int64_t)(crc(0, body, (uint32_t)body_len) & 0x7FFFFFFFu) != (int64_t)body_crc)
            goto bad;
        if (topic == NULL || topic_len != topic_len_last ||
            memcmp(topic_raw, t + 1, topic_len) != 0) {
            for (Py_ssize_t i = 0; i < topic_len; i++)
                if (t[1 + i] & 0x80) goto bad; /* not ASCII */
            Py_XDECREF(topic);
            topic = PyUnicode_DecodeASCII((const char *)t + 1, topic_len, NULL);
            if (topic == NULL) goto fail;
            topic_raw = t + 1, topic_len_last = topic_len;
        }
        if (born == NULL || memcmp(born_raw, r + 48, 8) != 0) {
            Py_XDECREF(born);
            if ((born = host_str(r + 48)) == NULL) goto fail;
            born_raw = r + 48;
        }
        if (stored == NULL || memcmp(stored_raw, r + 64, 8) != 0) {
            Py_XDECREF(stored);
            if ((stored = host_str(r + 64)) == NULL) goto fail;
            stored_raw = r + 64;
        }
        PyObject *m = type->tp_alloc(type, 16);
        if (m == NULL) goto fail;
        PyObject *items[16] = {
            Py_NewRef(topic),
            PyBytes_FromStringAndSize((const char *)body, body_len),
            PyLong_FromLong((int32_t)get_be32(r + 12)),                /* queue id */
            PyLong_FromLongLong((int64_t)get_be64(r + 20)),            /* queue offset */
            PyLong_FromLongLong((int64_t)get_be64(r + 28)),            /* commitlog offset */
            PyLong_FromLong(size),                                     /* store size */
            PyLong_FromLongLong((int64_t)get_be64(r + 40)),            /* born timestamp */
            PyLong_FromLongLong((int64_t)get_be64(r + 56)),            /* store timestamp */
            Py_NewRef(born),
            Py_NewRef(stored),
            PyLong_FromLong((int32_t)get_be32(r + 16)),                /* flag */
            PyLong_FromLong(sys_flag),
            PyLong_FromLong(body_crc),
            PyLong_FromLong((int32_t)get_be32(r + 72)),                /* reconsume times */
            PyLong_FromLongLong((int64_t)get_be64(r + 76)),            /* prepared offset */
            PyBytes_FromStringAndSize((const char *)pl + 2, prop_len), /* raw properties */
        };
        int ok = 1;
        for (int i = 0; i < 16; i++) {
            if (items[i] == NULL) ok = 0;
            PyTuple_SET_ITEM(m, i, items[i]); /* NULLs are skipped by the tuple's dealloc */
        }
        if (!ok || PyList_Append(out, m) < 0) {
            Py_DECREF(m);
            goto fail;
        }
        Py_DECREF(m);
        pos += size;
    }
    goto done;
bad:
    Py_CLEAR(out);
    out = Py_NewRef(Py_None);
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_XDECREF(topic);
    Py_XDECREF(born);
    Py_XDECREF(stored);
    PyBuffer_Release(&data);
    return out;
}


PyDoc_STRVAR(parse_send_doc,
             "parse_send(blob, sysflags, crc_address, max_topic_len) -> tuple or None\n\n"
             "EncodedBatch.from_bytes and its check_structure at once, for a batch of the\n"
             "usual shape (one numbered run at most, topics of [A-Za-z0-9_%|-], ASCII keys):\n"
             "(n, k, d, r, epoch, flags, topics, uniq, producer, at, data_at, min_body,\n"
             "max_body), where ``at`` is where the eight arrays start and ``data_at`` the\n"
             "records; the records checked as verify_records checks them, and an idempotent\n"
             "batch's PRODUCER_SEQ mark compared with its numbering. None for anything else,\n"
             "which the Python path decides (and names the error of): this never raises\n"
             "on the blob's content, and accepts nothing the Python path refuses. The\n"
             "producer id's form is left to the caller.");

static inline int32_t get_le32s(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return (int32_t)v;
}

static inline int64_t get_le64s(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return (int64_t)v;
}

static inline int topic_char(unsigned char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '%' || c == '|' || c == '-';
}

#define PARSE_MAX_TOPICS 64 /* more topics in one send: the Python path */

static PyObject *parse_send(PyObject *self, PyObject *args) {
    PyObject *blob_obj;
    unsigned long sysflags;
    unsigned long long crc_address;
    Py_ssize_t max_topic_len;
    if (!PyArg_ParseTuple(args, "OkKn", &blob_obj, &sysflags, &crc_address, &max_topic_len))
        return NULL;
#if !PY_LITTLE_ENDIAN /* the wire's arrays are little-endian: the Python path swaps them */
    Py_RETURN_NONE;
#else
    Py_buffer b;
    if (PyObject_GetBuffer(blob_obj, &b, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear(); /* the Python path names what it is */
        Py_RETURN_NONE;
    }
    PyObject *result = NULL, *topics = NULL, *uniq = NULL, *producer = NULL;
    const unsigned char *p = b.buf;
    const Py_ssize_t len = b.len;
    if (len < 36) goto fallback;
    int32_t h[9];
    for (int i = 0; i < 9; i++) h[i] = (int32_t)get_be32(p + 4 * i);
    const int32_t n = h[0], k = h[1], lt = h[2], lu = h[3], d = h[4], lp = h[5], r = h[6];
    const int32_t epoch = h[7], flags = h[8];
    for (int i = 0; i < 8; i++)
        if (h[i] < 0) goto fallback;
    if ((d != 0 && d != n) || r > n || (lp == 0) != (r == 0) || n == 0 || r > 1) goto fallback;
    /* where each part starts: 64-bit sums of int32 counts (no overflow, even where
     * Py_ssize_t is 32 bits), all within the blob once the last one is */
    const int64_t end64 = 36 + (int64_t)lt + lu + lp + 18 * (int64_t)n + 8 * (int64_t)k +
                          4 * (int64_t)d + 16 * (int64_t)r;
    if (end64 > (int64_t)len) goto fallback;
    const Py_ssize_t topics_at = 36, uniq_at = topics_at + lt, prod_at = uniq_at + lu;
    const Py_ssize_t at = prod_at + lp, idx_at = at + 4 * (Py_ssize_t)n;
    const Py_ssize_t qids_at = at + 6 * (Py_ssize_t)n, tags_at = qids_at + 4 * (Py_ssize_t)n;
    const Py_ssize_t hashes_at = tags_at + 8 * (Py_ssize_t)n;
    const Py_ssize_t owners_at = hashes_at + 4 * (Py_ssize_t)k;
    const Py_ssize_t delays_at = owners_at + 4 * (Py_ssize_t)k;
    const Py_ssize_t runs_at = delays_at + 4 * (Py_ssize_t)d;
    const Py_ssize_t data_at = runs_at + 16 * (Py_ssize_t)r;
    /* the topics: non-empty names of topic characters, at most max_topic_len each */
    const unsigned char *names[PARSE_MAX_TOPICS];
    Py_ssize_t name_lens[PARSE_MAX_TOPICS];
    Py_ssize_t ntopics = 0, start = topics_at;
    for (Py_ssize_t i = topics_at; i <= uniq_at; i++) {
        if (i < uniq_at && p[i] != 0) {
            if (!topic_char(p[i])) goto fallback;
            continue;
        }
        const Py_ssize_t l = i - start;
        if (l == 0 || l > max_topic_len || ntopics == PARSE_MAX_TOPICS) goto fallback;
        names[ntopics] = p + start, name_lens[ntopics] = l, ntopics++;
        start = i + 1;
    }
    for (Py_ssize_t i = uniq_at; i < at; i++) /* unique keys and producer id: ASCII */
        if (p[i] & 0x80) goto fallback;
    for (int32_t i = 0; i < d; i++)
        if (get_le32s(p + delays_at + 4 * (Py_ssize_t)i) < 0) goto fallback;
    const int32_t q0 = get_le32s(p + qids_at);
    int same_queue = 1;
    for (int32_t i = 0; i < n; i++) {
        const int32_t q = get_le32s(p + qids_at + 4 * (Py_ssize_t)i);
        if (q < 0) goto fallback;
        same_queue &= q == q0;
    }
    for (int32_t i = 0; i < k; i++) {
        const int32_t o = get_le32s(p + owners_at + 4 * (Py_ssize_t)i);
        if (o < 0 || o >= n) goto fallback;
    }
    int64_t seq = 0;
    if (r == 1) { /* one run: of the whole batch, from record 0, on one queue */
        if (get_le64s(p + runs_at) != 0) goto fallback;
        seq = get_le64s(p + runs_at + 8);
        if (seq < 0) goto fallback;
        if (n > 1 && (ntopics != 1 || !same_queue)) goto fallback;
    }
    crc_fn crc = crc_address ? (crc_fn)(uintptr_t)crc_address : crc_builtin;
    verdict v;
    BEGIN_WORK(len - data_at)
    verify_loop(p + data_at, len - data_at, p + at, p + idx_at, n, names, name_lens, ntopics,
                (uint32_t)sysflags, crc, &v);
    END_WORK
    if (v.bad >= 0) goto fallback;
    if (v.seq_pairs != r) goto fallback; /* a mark where no run is, or two: Python's */
    if (r == 1) { /* the first record's properties end with the run's bound slot */
        char mark[SEQ_NAME_LEN + 256];
        memcpy(mark, SEQ_NAME, SEQ_NAME_LEN);
        if (lp > 160) goto fallback; /* no producer id is longer */
        memcpy(mark + SEQ_NAME_LEN, p + prod_at, lp);
        const int tail = snprintf(mark + SEQ_NAME_LEN + lp, sizeof mark - SEQ_NAME_LEN - lp,
                                  ",%010d,%019lld,%010d\x02", (int)epoch, (long long)seq, (int)n);
        if (tail < 0 || (size_t)tail >= sizeof mark - SEQ_NAME_LEN - lp) goto fallback;
        const Py_ssize_t m = SEQ_NAME_LEN + lp + tail;
        const unsigned char *rec = p + data_at;
        const unsigned char *tp = rec + HDR_LEN + (int32_t)get_be32(rec + 84); /* checked */
        const unsigned char *pp = tp + 1 + tp[0];
        const Py_ssize_t plen = (pp[0] << 8) | pp[1];
        const unsigned char *end = pp + 2 + plen;
        if (m > plen || memcmp(end - m, mark, m) != 0 || (m != plen && end[-m - 1] != 2))
            goto fallback;
    }
    topics = PyTuple_New(ntopics);
    if (!topics) goto done;
    for (Py_ssize_t t = 0; t < ntopics; t++) {
        PyObject *name = PyUnicode_DecodeASCII((const char *)names[t], name_lens[t], NULL);
        if (!name) goto done;
        PyTuple_SET_ITEM(topics, t, name);
    }
    uniq = PyBytes_FromStringAndSize((const char *)p + uniq_at, lu);
    if (!uniq) goto done;
    if (lp) {
        producer = PyUnicode_DecodeASCII((const char *)p + prod_at, lp, NULL);
        if (!producer) goto done;
    } else {
        producer = Py_NewRef(Py_None);
    }
    result = Py_BuildValue("iiiiiiOOOnnii", n, k, d, r, epoch, flags, topics, uniq, producer,
                           at, data_at, v.lo, v.hi);
    goto done;
fallback:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(topics);
    Py_XDECREF(uniq);
    Py_XDECREF(producer);
    PyBuffer_Release(&b);
    return result;
#endif
}

/* ------------------------------------------------------------------ module */
PyDoc_STRVAR(write_one_doc,
             "write_one(log, log_at, record, queue_id, queue_offset, phys, store_ts, host,\n"
             "          cq, cq_at, tag, index, slots, count, hashes, diff, begin_ts,\n"
             "          begin_offset, end_offset, slot_count) -> fresh\n\n"
             "A single send's put in one call, in the order a crash may cut it: the\n"
             "``record`` copied into the writable CommitLog mapping ``log`` at ``log_at``\n"
             "with its QUEUEID, QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP and STOREHOST\n"
             "(``host``, 8 bytes) written; its ConsumeQueue entry (``phys``, the record's\n"
             "size, ``tag``: 20 bytes big-endian) into ``cq`` at ``cq_at``; and, when\n"
             "``index`` is not None, an IndexFile entry for each of ``hashes`` (a list of\n"
             "at most 16 non-negative ints) numbered from ``count``, each linked at the\n"
             "head of its slot (of ``slots``; a head not in 1..count-1 is none), then the\n"
             "slots, then the file's header: ``begin_ts``, ``store_ts``, ``begin_offset``,\n"
             "``end_offset``, the slots used (``slot_count`` plus those that were empty)\n"
             "and the count after. Returns how many slots were empty. Nothing moves a\n"
             "write position: the caller publishes. Checks every place lies inside its\n"
             "buffer before writing any.");

#define WRITE_ONE_KEYS 16

static PyObject *write_one(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 20) {
        PyErr_Format(PyExc_TypeError, "write_one takes 20 arguments (%zd given)", nargs);
        return NULL;
    }
    long long v[20];
    static const int ints[] = {1, 3, 4, 5, 6, 9, 10, 12, 13, 15, 16, 17, 18, 19};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        v[ints[i]] = PyLong_AsLongLong(args[ints[i]]);
        if (v[ints[i]] == -1 && PyErr_Occurred()) return NULL;
    }
    const int has_index = args[11] != Py_None;
    long long hashes[WRITE_ONE_KEYS];
    Py_ssize_t nkeys = 0;
    if (has_index) {
        if (!PyList_Check(args[14])) {
            PyErr_SetString(PyExc_TypeError, "hashes must be a list");
            return NULL;
        }
        nkeys = PyList_GET_SIZE(args[14]);
        if (nkeys > WRITE_ONE_KEYS) {
            PyErr_Format(PyExc_ValueError, "more than %d hashes", WRITE_ONE_KEYS);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < nkeys; i++) {
            hashes[i] = PyLong_AsLongLong(PyList_GET_ITEM(args[14], i));
            if (hashes[i] == -1 && PyErr_Occurred()) return NULL;
        }
    }
    Py_buffer log = {0}, rec = {0}, host = {0}, cq = {0}, idx = {0};
    PyObject *result = NULL;
    if (get_array(args[0], &log, 1, 1, "log") < 0) goto out;
    if (get_array(args[2], &rec, 1, 0, "record") < 0) goto out;
    if (get_array(args[7], &host, 1, 0, "host") < 0) goto out;
    if (get_array(args[8], &cq, 1, 1, "cq") < 0) goto out;
    if (has_index && get_array(args[11], &idx, 1, 1, "index") < 0) goto out;
    const long long log_at = v[1], cq_at = v[9], slots = v[12], count = v[13];
    const Py_ssize_t size = rec.len;
    if (host.len != 8) {
        PyErr_SetString(PyExc_ValueError, "host must be 8 bytes");
        goto out;
    }
    if (size < HDR_LEN || (long long)(int32_t)size != size ||
        get_be32((const unsigned char *)rec.buf) != (uint32_t)size) {
        PyErr_SetString(PyExc_ValueError, "record: its TOTALSIZE is not its length");
        goto out;
    }
    if (log_at < 0 || log_at > log.len - size) {
        PyErr_SetString(PyExc_ValueError, "record past the end of the log");
        goto out;
    }
    if (cq_at < 0 || cq_at > cq.len - 20) {
        PyErr_SetString(PyExc_ValueError, "entry past the end of the queue file");
        goto out;
    }
    const long long entries_at = 40 + 4 * slots + 20 * count;
    if (has_index) {
        int bad = slots <= 0 || count <= 0 || count > 0x7FFFFFFF - nkeys ||
                  slots > (idx.len - 40) / 4 || entries_at > idx.len - 20 * nkeys;
        for (Py_ssize_t i = 0; i < nkeys; i++) bad |= hashes[i] < 0;
        if (bad) {
            PyErr_SetString(PyExc_ValueError, "index entry or slot past the end of the index file");
            goto out;
        }
    }
    long fresh = 0;
    {
        unsigned char *r = (unsigned char *)log.buf + log_at;
        memcpy(r, rec.buf, size);
        put_be32(r + 12, (uint32_t)v[3]);
        put_be64(r + 20, (uint64_t)v[4]);
        put_be64(r + 28, (uint64_t)v[5]);
        put_be64(r + 56, (uint64_t)v[6]);
        memcpy(r + 64, host.buf, 8);
        unsigned char *e = (unsigned char *)cq.buf + cq_at;
        put_be64(e, (uint64_t)v[5]);
        put_be32(e + 8, (uint32_t)size);
        put_be64(e + 12, (uint64_t)v[10]);
    }
    if (has_index && nkeys) {
        unsigned char *b = idx.buf;
        long long slot_of[WRITE_ONE_KEYS], head_of[WRITE_ONE_KEYS]; /* this call's heads */
        Py_ssize_t nheads = 0;
        unsigned char *e = b + entries_at;
        for (Py_ssize_t i = 0; i < nkeys; i++) { /* the entries, as IndexFile._link_few */
            const long long slot = hashes[i] % slots, number = count + i;
            Py_ssize_t h = 0;
            while (h < nheads && slot_of[h] != slot) h++;
            int64_t prev;
            if (h < nheads) {
                prev = head_of[h];
            } else {
                prev = (int32_t)get_be32(b + 40 + 4 * slot);
                if (prev <= 0 || prev >= count) prev = 0; /* empty, or not a written entry */
                if (prev == 0) fresh++;
                slot_of[nheads++] = slot;
            }
            head_of[h] = number;
            put_be32(e, (uint32_t)hashes[i]);
            put_be64(e + 4, (uint64_t)v[5]);
            put_be32(e + 12, (uint32_t)v[15]);
            put_be32(e + 16, (uint32_t)prev);
            e += 20;
        }
        __asm__ __volatile__("" ::: "memory"); /* the entries, then the slots, then the header */
        for (Py_ssize_t h = 0; h < nheads; h++) put_be32(b + 40 + 4 * slot_of[h], (uint32_t)head_of[h]);
        __asm__ __volatile__("" ::: "memory");
        put_be64(b, (uint64_t)v[16]);
        put_be64(b + 8, (uint64_t)v[6]);
        put_be64(b + 16, (uint64_t)v[17]);
        put_be64(b + 24, (uint64_t)v[18]);
        put_be32(b + 32, (uint32_t)(v[19] + fresh));
        put_be32(b + 36, (uint32_t)(count + nkeys));
    }
    result = PyLong_FromLong(fresh);
out:
    if (log.obj) PyBuffer_Release(&log);
    if (rec.obj) PyBuffer_Release(&rec);
    if (host.obj) PyBuffer_Release(&host);
    if (cq.obj) PyBuffer_Release(&cq);
    if (idx.obj) PyBuffer_Release(&idx);
    return result;
}

static PyObject *crc32_builtin(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t c = crc_builtin(0, b.buf, (uint32_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_O, "bind(Message): take the offsets of its slots."},
    {"encode_plain", encode_plain, METH_VARARGS, encode_plain_doc},
    {"crc32_builtin", crc32_builtin, METH_O, "The fallback CRC-32 of a buffer (tests)."},
    {"scan_records", scan_records, METH_VARARGS, scan_records_doc},
    {"verify_records", verify_records, METH_VARARGS, verify_records_doc},
    {"patch_records", patch_records, METH_VARARGS, patch_records_doc},
    {"link_index", link_index, METH_VARARGS, link_index_doc},
    {"body_slices", body_slices, METH_VARARGS, body_slices_doc},
    {"decode_records", decode_records, METH_VARARGS, decode_records_doc},
    {"parse_send", parse_send, METH_VARARGS, parse_send_doc},
    {"write_one", (PyCFunction)(void (*)(void))write_one, METH_FASTCALL, write_one_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "storage._native",
    "The hot loops of a producer and a broker in C (see the comment at the top).", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    crc_init();
    return PyModule_Create(&module);
}
