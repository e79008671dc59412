/**
 * RFC 6455 §5.3 client masking: a payload XORed with a 4-byte key, written into a frame. The XOR
 * runs in WebAssembly SIMD over a 64 KiB scratch (docs/decisions/node-link-websocket-client.md);
 * where WebAssembly cannot run (`--v8-flags=--jitless`) it is done byte by byte.
 *
 * The module (104 bytes, embedded below) is this text, compiled with `wat2wasm --enable-simd`:
 *
 * ```wat
 * (module
 *   (memory (export "memory") 1)
 *   ;; XORs bytes [0, len) of memory with the key, 16 at a time; returns the bytes done
 *   ;; (len rounded down to 16); the caller masks the rest.
 *   (func (export "mask") (param $len i32) (param $key i32) (result i32)
 *     (local $i i32) (local $k v128)
 *     (local.set $k (i32x4.splat (local.get $key)))
 *     (block $done
 *       (loop $next
 *         (br_if $done (i32.gt_u (i32.add (local.get $i) (i32.const 16)) (local.get $len)))
 *         (v128.store (local.get $i) (v128.xor (v128.load (local.get $i)) (local.get $k)))
 *         (local.set $i (i32.add (local.get $i) (i32.const 16)))
 *         (br $next)))
 *     (local.get $i)))
 * ```
 *
 * @module
 */

const _WASM =
  "AGFzbQEAAAABBwFgAn9/AX8DAgEABQMBAAEHEQIGbWVtb3J5AgAEbWFzawAACjkBNwIBfwF7IAH9ESEDAkADQCACQRBqIABLDQEgAiAC/QAEACAD/VH9CwQAIAJBEGohAgwACwsgAgs=";

/** The scratch: the module's one 64 KiB page. */
const _SCRATCH_BYTES = 64 * 1024;

/** The module's `mask` and its scratch; `null` where WebAssembly cannot run (`--jitless`). */
const _simd = _instantiate();

function _instantiate():
  | { mask: (length: number, key: number) => number; scratch: Uint8Array }
  | null {
  let instance: WebAssembly.Instance;
  try {
    instance = new WebAssembly.Instance(
      new WebAssembly.Module(Uint8Array.from(atob(_WASM), (c) => c.charCodeAt(0))),
    );
  } catch {
    return null; // masked byte by byte below: correct, several times slower
  }
  const memory = instance.exports.memory as WebAssembly.Memory;
  return {
    mask: instance.exports.mask as (length: number, key: number) => number,
    // The memory never grows, so this view stays attached.
    scratch: new Uint8Array(memory.buffer, 0, _SCRATCH_BYTES),
  };
}

/**
 * Writes `payload` XOR `key` (byte `i` with `key[(phase + i) % 4]`) into `out`, which must be at
 * least as long as `payload`. `payload` and `out` may be any views, aligned or not, and either the
 * same view (unmasked in place) or not overlapping at all. `phase` is the payload's offset in the message it is part of (a message sent in
 * pieces is masked piece by piece).
 */
export function maskInto(
  payload: Uint8Array,
  key: Uint8Array,
  out: Uint8Array,
  phase = 0,
): void {
  if (key.length !== 4) throw new RangeError(`a masking key is 4 bytes, not ${key.length}`);
  if (out.length < payload.length) {
    throw new RangeError(`out holds ${out.length} bytes, the payload ${payload.length}`);
  }
  if (phase % 4 !== 0) {
    const p = phase % 4;
    key = Uint8Array.of(key[p], key[(p + 1) % 4], key[(p + 2) % 4], key[(p + 3) % 4]);
  }
  if (!_simd) {
    for (let i = 0; i < payload.length; i++) out[i] = payload[i] ^ key[i & 3];
    return;
  }
  const { mask, scratch } = _simd;
  // WebAssembly loads little-endian: lane byte j of the splatted word is key[j].
  const keyWord = (key[0] | key[1] << 8 | key[2] << 16 | key[3] << 24) >>> 0;
  // Every piece but the last is a multiple of 16 bytes long, so byte i of a piece keeps the
  // key byte (i % 4) it has in the payload.
  for (let at = 0; at < payload.length; at += _SCRATCH_BYTES) {
    const piece = payload.subarray(at, at + _SCRATCH_BYTES);
    scratch.set(piece);
    for (let i = mask(piece.length, keyWord); i < piece.length; i++) scratch[i] ^= key[i & 3];
    out.set(scratch.subarray(0, piece.length), at);
  }
}
