/* reduce.h - element kernels: combine, scale and convert buffers of every dtype. */
#ifndef KOLO_REDUCE_H
#define KOLO_REDUCE_H

#include "../common/common.h"

/* True when `op` means something for `dtype` (e.g. AVERAGE is not defined for BOOL, ADASUM only
 * for the floating dtypes). The kernels below take every valid op but ADASUM (coll/adasum.c). */
bool kolo__op_valid(kolo_dtype_t dtype, kolo_op_t op);

/* dst[i] = a[i] OP b[i] for i < count. dst may equal a or b (or both); other
 * overlaps are not allowed. AVERAGE combines as SUM (the caller divides).
 * float16/bfloat16 are computed in float32 and rounded to nearest even.
 * BOOL: SUM and MAX are OR, MIN and PRODUCT are AND (inputs are 0/1; any
 * non-zero byte counts as 1, results are 0/1). Integer SUM/PRODUCT wrap.
 * Pure function of its inputs: the same inputs give the same bits on every machine
 * that runs the same build (no reassociation across elements). */
void kolo__reduce(void *dst, const void *a, const void *b, size_t count, kolo_dtype_t dtype,
                  kolo_op_t op);

/* dst[i] = src[i] * factor (dst may equal src). Floating types compute in their own
 * precision (float16/bfloat16 through float32; float64 in double).
 * Integer types compute (double)v * factor and truncate toward zero, saturating at the
 * type's range. BOOL: unchanged. factor == 1.0 must be a plain copy (or nothing in place). */
void kolo__scale(void *dst, const void *src, size_t count, kolo_dtype_t dtype, double factor);

/* dst[i] = (a[i] OP b[i]) * factor: the same bits as kolo__reduce into dst then kolo__scale of
 * dst (the same aliasing rules), in one pass over the data for SUM and AVERAGE of float32 and
 * float64 (the sum rounded to the type, then multiplied). */
void kolo__reduce_scale(void *dst, const void *a, const void *b, size_t count, kolo_dtype_t dtype, kolo_op_t op,
                        double factor);

/* In place: buf[i] = buf[i] / n for the integer dtypes, with C's truncation toward zero,
 * exactly (int64 does not go through double). For floating dtypes it multiplies by 1.0/n
 * (as kolo__scale). BOOL: unchanged. Used for integer AVERAGE. */
void kolo__divide(void *buf, size_t count, kolo_dtype_t dtype, int n);

/* memcpy with non-temporal stores on x86-64 (a plain memcpy elsewhere): the destination's lines
 * are written without being read first and are not kept in cache, a third less memory traffic
 * for a copy much larger than the cache whose destination is not read again soon. Other cores
 * see the bytes only after kolo__stream_fence(). */
void kolo__stream_copy(void *dst, const void *src, size_t n);
void kolo__stream_fence(void);
/* memcpy (no overlap), except where the destination lies 1-63 bytes past the source modulo 4096:
 * there memcpy's `rep movsb` crawls on some CPUs, and a vector loop copies instead (reduce.c). */
void kolo__copy(void *dst, const void *src, size_t n);

/* Conversions for float16 (IEEE binary16) and bfloat16, round to nearest even,
 * NaN stays NaN, overflow goes to infinity. */
float kolo__f16_to_f32(uint16_t h);
uint16_t kolo__f32_to_f16(float f);
float kolo__bf16_to_f32(uint16_t h);
uint16_t kolo__f32_to_bf16(float f);
void kolo__f16_to_f32_n(float *dst, const uint16_t *src, size_t n);
void kolo__f32_to_f16_n(uint16_t *dst, const float *src, size_t n);
void kolo__bf16_to_f32_n(float *dst, const uint16_t *src, size_t n);
void kolo__f32_to_bf16_n(uint16_t *dst, const float *src, size_t n);

/* Which vector code the kernels picked at run time ("avx512+fp16", "avx512+f16c+bf16",
 * "avx512+f16c", "avx512", "avx2+f16c", "generic"). */
const char *kolo__reduce_isa(void);

/* For tests and benchmarks: makes every later call use the named vector code (a name
 * kolo__reduce_isa() returns), or the best one for this CPU when name is NULL. Returns
 * false, changing nothing, when this CPU or build cannot run it. Call it while no other
 * thread is inside a kernel. */
bool kolo__reduce_set_isa(const char *name);

#endif
