/* memfit.data.format.cwindow: the block reader's inner loops over a window's records, in C,
 * in one call each and without the GIL.
 *
 * A window is a few hundred records whose samples go to rows all over its batches. From
 * Python, each record piece costs a call and a GIL hand-over, and every pass over the
 * window's bytes (read, checksum, gather) goes through main memory again. Here:
 *
 * - read_records: each record is read with one preadv straight to where its pieces go
 *   (frame header, tags, each sample's values to its batch row, CRC), and its CRC32C
 *   computed over those pieces while they are still in the CPU cache: the kernel's copy
 *   out of the page cache is the only copy of the data. A read that comes back short or
 *   fails is read again through a small staging buffer (the file cut short, EINTR),
 *   as before: the bytes there, then copied to the pieces.
 * - crc_spans: the CRC32C of records already scattered over pieces of memory.
 *
 * The CRC itself is computed by the function whose address the caller passes: the
 * crc32c_extend of google_crc32c (hardware-accelerated where the CPU has it), so no
 * checksum code lives here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

/* The pieces are uint64 (address, bytes) pairs: struct iovec on LP64 Linux. */
_Static_assert(sizeof(struct iovec) == 16 && offsetof(struct iovec, iov_len) == 8,
               "struct iovec is not an (address, bytes) pair of uint64");
#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

typedef uint32_t (*extend_fn)(uint32_t crc, const uint8_t *data, size_t count);

#define AT(type, address) ((type)(uintptr_t)(address))

static int
check_addresses(unsigned long long fn, Py_ssize_t n, unsigned long long a,
                unsigned long long b, unsigned long long c)
{
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "n must be >= 0; received n=%zd", n);
        return -1;
    }
    if (fn == 0 || (n > 0 && (a == 0 || b == 0 || c == 0))) {
        PyErr_Format(PyExc_ValueError, "addresses must not be null; received fn=%llu and "
                     "%llu, %llu, %llu", fn, a, b, c);
        return -1;
    }
    return 0;
}

static PyObject *
crc_spans(PyObject *self, PyObject *args)
{
    unsigned long long fn, pieces, spans, out;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "KKKnK", &fn, &pieces, &spans, &n, &out)
        || check_addresses(fn, n, pieces, spans, out) < 0)
        return NULL;
    extend_fn extend = AT(extend_fn, fn);
    const uint64_t *piece = AT(const uint64_t *, pieces);   /* [P][2]: address, bytes */
    const int64_t *span = AT(const int64_t *, spans);       /* [n][2]: first, end */
    uint32_t *crc = AT(uint32_t *, out);                    /* [n] */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t c = 0;
        for (int64_t p = span[2 * i]; p < span[2 * i + 1]; p++)
            c = extend(c, AT(const uint8_t *, piece[2 * p]), (size_t)piece[2 * p + 1]);
        crc[i] = c;
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *
read_records(PyObject *self, PyObject *args)
{
    unsigned long long fn, fds, offsets, pieces, spans, staging, got_out, crc_out;
    Py_ssize_t n, staging_bytes;
    if (!PyArg_ParseTuple(args, "KnKKKKKnKK", &fn, &n, &fds, &offsets, &pieces, &spans,
                          &staging, &staging_bytes, &got_out, &crc_out)
        || check_addresses(fn, n, fds, offsets, pieces) < 0
        || check_addresses(fn, n, spans, staging, got_out) < 0
        || check_addresses(fn, n, crc_out, crc_out, crc_out) < 0)
        return NULL;
    extend_fn extend = AT(extend_fn, fn);
    const int32_t *fd = AT(const int32_t *, fds);
    const int64_t *offset = AT(const int64_t *, offsets);
    const uint64_t *piece = AT(const uint64_t *, pieces);
    const int64_t *span = AT(const int64_t *, spans);
    uint8_t *stage = AT(uint8_t *, staging);
    int64_t *got = AT(int64_t *, got_out);
    uint32_t *crc = AT(uint32_t *, crc_out);
    int error = 0;
    Py_ssize_t failed = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && !error; i++) {
        int64_t first = span[2 * i], end = span[2 * i + 1], frame = 0;
        for (int64_t p = first; p < end; p++)
            frame += (int64_t)piece[2 * p + 1];
        got[i] = 0;
        crc[i] = 0;
        if (frame >= 16 && end - first >= 2 && end - first <= IOV_MAX) {
            ssize_t r = preadv(fd[i], AT(const struct iovec *, piece + 2 * first),
                               (int)(end - first), (off_t)offset[i]);
            if (r == frame) {                    /* the usual case: all of it, in place */
                got[i] = frame;
                uint32_t c = 0;
                for (int64_t p = first + 1; p < end - 1; p++)   /* not header, not CRC */
                    c = extend(c, AT(const uint8_t *, piece[2 * p]), (size_t)piece[2 * p + 1]);
                crc[i] = c;
                continue;
            }
        }
        if (frame > staging_bytes) {
            error = EOVERFLOW;
            failed = i;
            break;
        }
        while (got[i] < frame) {                 /* short only at the end of the file */
            ssize_t r = pread(fd[i], stage + got[i], (size_t)(frame - got[i]),
                              (off_t)(offset[i] + got[i]));
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0) {
                error = errno;
                failed = i;
                break;
            }
            if (r == 0)
                break;
            got[i] += r;
        }
        if (error || got[i] < frame)
            continue;                            /* cut short: the caller reports it */
        /* the payload: after the 12-byte frame header, before the 4-byte CRC */
        crc[i] = frame >= 16 ? extend(0, stage + 12, (size_t)(frame - 16)) : 0;
        const uint8_t *src = stage;
        for (int64_t p = first; p < end; p++) {
            memcpy(AT(void *, piece[2 * p]), src, (size_t)piece[2 * p + 1]);
            src += piece[2 * p + 1];
        }
    }
    Py_END_ALLOW_THREADS
    if (error) {
        if (error == EOVERFLOW)
            PyErr_Format(PyExc_ValueError, "record %zd does not fit the %zd-byte staging "
                         "buffer", failed, staging_bytes);
        else {
            errno = error;
            PyErr_SetFromErrno(PyExc_OSError);
        }
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"crc_spans", crc_spans, METH_VARARGS,
     "crc_spans(fn, pieces, spans, n, out): out[i] = the CRC32C of pieces spans[i][0]\n"
     "to spans[i][1] - 1, in order, for i < n. All arguments but n are addresses: fn of\n"
     "crc32c_extend(crc, data, count); pieces of uint64 (address, bytes) pairs; spans of\n"
     "int64 (first, end) pairs; out of uint32."},
    {"read_records", read_records, METH_VARARGS,
     "read_records(fn, n, fds, offsets, pieces, spans, staging, staging_bytes, got, crc):\n"
     "for i < n, reads record i (the sum of its pieces' bytes) from file descriptor\n"
     "fds[i] (int32) at offsets[i] (int64) to the pieces spans[i][0] to spans[i][1] - 1,\n"
     "in order (one preadv; read short, again through the staging buffer); got[i]\n"
     "(int64) = the bytes read (fewer: the file is cut short, nothing else done); else\n"
     "crc[i] (uint32) = the CRC32C of the payload (bytes 12 to the last 4, the pieces\n"
     "but the first and last). Arguments as for crc_spans."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cwindow",
    "The block reader's inner loops in C (see memfit.data.format.records).", -1, methods,
};

PyMODINIT_FUNC
PyInit_cwindow(void)
{
    return PyModule_Create(&module);
}
