/**
 * IPv6 literal check with the rules of Python's `ipaddress.IPv6Address`, which upstream
 * KCoral uses to validate `--host`.
 *
 * @module
 */

const _HEXTET = /^[0-9a-fA-F]{1,4}$/;
const _DECIMAL = /^[0-9]{1,3}$/;

/**
 * Whether `address` (without brackets) is an IPv6 address as Python's
 * `ipaddress.IPv6Address` parses it: 3 to 8 colon-separated groups of 1–4 hex digits,
 * at most one `::`, an optional trailing dotted IPv4 part. Scoped addresses (`%zone`) are
 * refused: a zone cannot be written in a URL that `fetch` accepts.
 *
 * @example
 * ```ts
 * import { isIPv6Address } from "./ipv6.ts";
 * isIPv6Address("::1"); // true
 * isIPv6Address("::ffff:192.0.2.1"); // true
 * isIPv6Address("::x"); // false
 * ```
 */
export function isIPv6Address(address: string): boolean {
  const parts = address.split(":");
  if (parts.length < 3) return false;
  if (parts[parts.length - 1].includes(".")) {
    if (!_isIPv4Address(parts.pop()!)) return false;
    parts.push("0", "0"); // the IPv4 part stands for two hextets
  }
  if (parts.length > 9) return false;
  let skip = -1;
  for (let index = 1; index < parts.length - 1; index++) {
    if (parts[index] === "") {
      if (skip !== -1) return false; // more than one '::'
      skip = index;
    }
  }
  let groups = parts;
  if (skip !== -1) {
    const high = parts.slice(0, skip);
    const low = parts.slice(skip + 1);
    if (high[0] === "") {
      if (high.length !== 1) return false; // a leading ':' only as part of '::'
      high.shift();
    }
    if (low[low.length - 1] === "") {
      if (low.length !== 1) return false; // a trailing ':' only as part of '::'
      low.pop();
    }
    if (high.length + low.length > 7) return false;
    groups = [...high, ...low];
  } else if (parts.length !== 8) {
    return false;
  }
  return groups.every((group) => _HEXTET.test(group));
}

function _isIPv4Address(address: string): boolean {
  const octets = address.split(".");
  return octets.length === 4 &&
    octets.every((octet) =>
      _DECIMAL.test(octet) && Number(octet) <= 255 && (octet.length === 1 || octet[0] !== "0")
    );
}
