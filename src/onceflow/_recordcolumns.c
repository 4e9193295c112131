/* The records of Kafka v2 record batches as Arrow columns, compiled: the Spark source's read tasks
 * walk every record they fetch through here (`onceflow.spark.fetching`), a few nanoseconds a record
 * where confluent-kafka's Message objects and the Python that reads them cost about two
 * microseconds. A `Columns` builder takes one uncompressed records section at a time (`add`) and
 * hands out the buffers of the rows it holds (`take`): Arrow's layouts (validity bitmaps, int32
 * offsets, data), which pyarrow wraps without copying. Lengths are checked as the produce
 * validator's walk checks them (`_recordscan.c`): a damaged batch raises ValueError, never reads
 * past its buffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    char *data;
    Py_ssize_t size;
    Py_ssize_t capacity;
} Buffer;

static int grow(Buffer *b, Py_ssize_t more) {
    if (b->size + more <= b->capacity) {
        return 0;
    }
    Py_ssize_t capacity = b->capacity ? b->capacity : 4096;
    while (capacity < b->size + more) {
        capacity *= 2;
    }
    char *data = PyMem_Realloc(b->data, capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->capacity = capacity;
    return 0;
}

static int put(Buffer *b, const void *bytes, Py_ssize_t length) {
    if (grow(b, length)) {
        return -1;
    }
    memcpy(b->data + b->size, bytes, length);
    b->size += length;
    return 0;
}

/* A binary (or string) column: validity bits, int32 offsets, data. */
typedef struct {
    Buffer validity;
    Buffer offsets;
    Buffer data;
    Py_ssize_t nulls;
} Binary;

static int binary_start(Binary *c) {
    int32_t zero = 0;
    return put(&c->offsets, &zero, sizeof zero);
}

static int binary_add(Binary *c, Py_ssize_t row, const unsigned char *bytes, int64_t length) {
    if (grow(&c->validity, 1)) {
        return -1;
    }
    if (row % 8 == 0) {
        c->validity.data[c->validity.size++] = 0;
    }
    if (length >= 0) {
        c->validity.data[c->validity.size - 1] |= (char)(1 << (row % 8));
        if (c->data.size + length > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "more than 2 GiB of bytes in one column");
            return -1;
        }
        if (put(&c->data, bytes, (Py_ssize_t)length)) {
            return -1;
        }
    } else {
        c->nulls++;
    }
    int32_t end = (int32_t)c->data.size;
    return put(&c->offsets, &end, sizeof end);
}

static void buffer_clear(Buffer *b) {
    PyMem_Free(b->data);
    b->data = NULL;
    b->size = b->capacity = 0;
}

static void binary_clear(Binary *c) {
    buffer_clear(&c->validity);
    buffer_clear(&c->offsets);
    buffer_clear(&c->data);
    c->nulls = 0;
}

typedef struct {
    PyObject_HEAD
    Py_ssize_t rows;
    Py_ssize_t headers; /* header entries, over all rows */
    Binary keys, values;
    Buffer offsets, timestamps, timestamp_types;
    Buffer header_offsets; /* int32, rows + 1: where each row's headers start among all headers */
    Binary header_keys, header_values;
} Columns;

static int columns_start(Columns *self) {
    int32_t zero = 0;
    if (binary_start(&self->keys) || binary_start(&self->values) || binary_start(&self->header_keys) ||
        binary_start(&self->header_values)) {
        return -1;
    }
    return put(&self->header_offsets, &zero, sizeof zero);
}

static void columns_clear(Columns *self) {
    binary_clear(&self->keys);
    binary_clear(&self->values);
    binary_clear(&self->header_keys);
    binary_clear(&self->header_values);
    buffer_clear(&self->offsets);
    buffer_clear(&self->timestamps);
    buffer_clear(&self->timestamp_types);
    buffer_clear(&self->header_offsets);
    self->rows = self->headers = 0;
}

static int Columns_init(Columns *self, PyObject *args, PyObject *kwargs) {
    if (!PyArg_ParseTuple(args, ":Columns")) {
        return -1;
    }
    columns_clear(self);
    return columns_start(self);
}

static void Columns_dealloc(Columns *self) {
    columns_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

typedef struct {
    const unsigned char *data;
    Py_ssize_t end;
    Py_ssize_t pos;
} Reader;

/* A zigzag varint (at most 10 bytes when `longs`, else at most 5 and within an int32). */
static int read_varint(Reader *r, int longs, int64_t *out) {
    uint64_t raw = 0;
    int limit = longs ? 10 : 5;
    for (int i = 0; i < limit; i++) {
        if (r->pos >= r->end) {
            return -1;
        }
        unsigned char byte = r->data[r->pos++];
        raw |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (!(byte & 0x80)) {
            int64_t value = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            if (!longs && (value < INT32_MIN || value > INT32_MAX)) {
                return -1;
            }
            *out = value;
            return 0;
        }
    }
    return -1;
}

/* A length of -1 (null) or more that fits before `end`. */
static int read_length(Reader *r, int nullable, int64_t *out) {
    if (read_varint(r, 0, out) || *out < (nullable ? -1 : 0) || r->pos + (*out > 0 ? *out : 0) > r->end) {
        return -1;
    }
    return 0;
}

static PyObject *bad(Py_ssize_t index, const char *what) {
    PyErr_Format(PyExc_ValueError, "record %zd %s", index, what);
    return NULL;
}

/* add(records, count, base_offset, base_timestamp, log_append_time, max_timestamp, first, end):
 * the records whose offsets are in [first, end), of `count` records in an uncompressed records
 * section; returns how many it added. A batch is added whole or not at all. */
static PyObject *Columns_add(Columns *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t count;
    long long base_offset, base_timestamp, max_timestamp, first, end;
    int log_append_time;
    if (!PyArg_ParseTuple(args, "y*nLLpLLL", &view, &count, &base_offset, &base_timestamp, &log_append_time,
                          &max_timestamp, &first, &end)) {
        return NULL;
    }
    /* Where every buffer stood, to take a damaged batch's rows back. */
    Columns saved = *self;
    Reader r = {(const unsigned char *)view.buf, view.len, 0};
    PyObject *result = NULL;
    int32_t type = log_append_time ? 1 : 0;
    Py_ssize_t index;
    for (index = 0; index < count; index++) {
        int64_t length, timestamp_delta, offset_delta, key_length, value_length, header_count;
        if (read_varint(&r, 0, &length) || length < 6 || r.pos + length > r.end) {
            bad(index, "runs past the end of its batch");
            goto failed;
        }
        Reader record = {r.data, r.pos + (Py_ssize_t)length, r.pos + 1}; /* past the attributes */
        r.pos = record.end;
        if (read_varint(&record, 1, &timestamp_delta) || read_varint(&record, 0, &offset_delta)) {
            bad(index, "has a bad timestamp or offset delta");
            goto failed;
        }
        if (read_length(&record, 1, &key_length)) {
            bad(index, "has a bad key length");
            goto failed;
        }
        const unsigned char *key = record.data + record.pos;
        record.pos += key_length > 0 ? key_length : 0;
        if (read_length(&record, 1, &value_length)) {
            bad(index, "has a bad value length");
            goto failed;
        }
        const unsigned char *value = record.data + record.pos;
        record.pos += value_length > 0 ? value_length : 0;
        if (read_varint(&record, 0, &header_count) || header_count < 0 || record.pos + 2 * header_count > record.end) {
            bad(index, "has a bad header count");
            goto failed;
        }
        int64_t offset = base_offset + offset_delta;
        int keep = offset >= first && offset < end;
        if (keep && (binary_add(&self->keys, self->rows, key, key_length) ||
                     binary_add(&self->values, self->rows, value, value_length))) {
            goto failed;
        }
        for (int64_t h = 0; h < header_count; h++) {
            int64_t header_key_length, header_value_length;
            if (read_length(&record, 0, &header_key_length)) {
                bad(index, "has a bad header key");
                goto failed;
            }
            const unsigned char *header_key = record.data + record.pos;
            record.pos += header_key_length;
            if (read_length(&record, 1, &header_value_length)) {
                bad(index, "has a bad header value");
                goto failed;
            }
            const unsigned char *header_value = record.data + record.pos;
            record.pos += header_value_length > 0 ? header_value_length : 0;
            if (keep && (binary_add(&self->header_keys, self->headers, header_key, header_key_length) ||
                         binary_add(&self->header_values, self->headers, header_value, header_value_length))) {
                goto failed;
            }
            self->headers += keep;
        }
        if (record.pos != record.end) {
            bad(index, "is not as long as its length prefix says");
            goto failed;
        }
        if (!keep) {
            continue;
        }
        int64_t timestamp = log_append_time ? max_timestamp : base_timestamp + timestamp_delta;
        int32_t header_end = (int32_t)self->headers;
        if (put(&self->offsets, &offset, sizeof offset) || put(&self->timestamps, &timestamp, sizeof timestamp) ||
            put(&self->timestamp_types, &type, sizeof type) ||
            put(&self->header_offsets, &header_end, sizeof header_end)) {
            goto failed;
        }
        self->rows++;
    }
    if (r.pos != r.end) {
        PyErr_Format(PyExc_ValueError, "%zd bytes follow the %zd records the batch declares", r.end - r.pos, count);
        goto failed;
    }
    result = PyLong_FromSsize_t(self->rows - saved.rows);
    PyBuffer_Release(&view);
    return result;
failed:
    /* Sizes back to where they were; the buffers may have moved, so keep the new pointers. */
    self->rows = saved.rows;
    self->headers = saved.headers;
    Binary *binaries[] = {&self->keys, &self->values, &self->header_keys, &self->header_values};
    Binary *before[] = {&saved.keys, &saved.values, &saved.header_keys, &saved.header_values};
    for (int i = 0; i < 4; i++) {
        binaries[i]->validity.size = before[i]->validity.size;
        binaries[i]->offsets.size = before[i]->offsets.size;
        binaries[i]->data.size = before[i]->data.size;
        binaries[i]->nulls = before[i]->nulls;
        /* A row's validity byte may have gained bits past the restored rows: clear them. */
        Py_ssize_t kept = (i < 2 ? saved.rows : saved.headers);
        if (kept % 8) {
            binaries[i]->validity.data[binaries[i]->validity.size - 1] &= (char)((1 << (kept % 8)) - 1);
        }
    }
    self->offsets.size = saved.offsets.size;
    self->timestamps.size = saved.timestamps.size;
    self->timestamp_types.size = saved.timestamp_types.size;
    self->header_offsets.size = saved.header_offsets.size;
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *as_bytes(Buffer *b) {
    return PyBytes_FromStringAndSize(b->data ? b->data : "", b->size);
}

/* A binary column as (validity or None when nothing is null, offsets, data). */
static PyObject *binary_take(Binary *c) {
    PyObject *validity = c->nulls ? as_bytes(&c->validity) : Py_NewRef(Py_None);
    PyObject *offsets = as_bytes(&c->offsets);
    PyObject *data = as_bytes(&c->data);
    if (validity == NULL || offsets == NULL || data == NULL) {
        Py_XDECREF(validity);
        Py_XDECREF(offsets);
        Py_XDECREF(data);
        return NULL;
    }
    return Py_BuildValue("(NNN)", validity, offsets, data);
}

/* take(): (rows, keys, values, offsets, timestamps, timestamp_types, header_offsets, header_keys,
 * header_values), each binary column a (validity, offsets, data) tuple, the rest bytes; then the
 * builder starts empty again. */
static PyObject *Columns_take(Columns *self, PyObject *unused) {
    PyObject *result = Py_BuildValue("(nNNNNNNNN)", self->rows, binary_take(&self->keys), binary_take(&self->values),
                                     as_bytes(&self->offsets), as_bytes(&self->timestamps),
                                     as_bytes(&self->timestamp_types), as_bytes(&self->header_offsets),
                                     binary_take(&self->header_keys), binary_take(&self->header_values));
    if (result == NULL) {
        return NULL;
    }
    columns_clear(self);
    if (columns_start(self)) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

static PyObject *Columns_get_rows(Columns *self, void *closure) {
    return PyLong_FromSsize_t(self->rows);
}

static PyObject *Columns_get_size(Columns *self, void *closure) {
    return PyLong_FromSsize_t(self->keys.data.size + self->values.data.size + self->header_keys.data.size +
                              self->header_values.data.size);
}

static PyMethodDef Columns_methods[] = {
    {"add", (PyCFunction)Columns_add, METH_VARARGS,
     "add(records, count, base_offset, base_timestamp, log_append_time, max_timestamp, first, end) -> rows added"},
    {"take", (PyCFunction)Columns_take, METH_NOARGS, "take() -> the rows' buffers; the builder starts again"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Columns_getset[] = {
    {"rows", (getter)Columns_get_rows, NULL, "rows held", NULL},
    {"size", (getter)Columns_get_size, NULL, "bytes of keys, values and headers held", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ColumnsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "onceflow._recordcolumns.Columns",
    .tp_basicsize = sizeof(Columns),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Rows of Kafka records, column by column, in Arrow's layouts",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Columns_init,
    .tp_dealloc = (destructor)Columns_dealloc,
    .tp_methods = Columns_methods,
    .tp_getset = Columns_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_recordcolumns", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__recordcolumns(void) {
    if (PyType_Ready(&ColumnsType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Columns", (PyObject *)&ColumnsType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
