/**
 * Register: a program-local reference to an instruction's value (spec §5.1).
 *
 * @module
 */

/**
 * A reference to the value an earlier instruction produces, inside the
 * {@linkcode Program} that created it. Sent on the wire as `{"$ref": id}`.
 *
 * @example
 * ```ts
 * import { Program, Register } from "./mod.ts";
 *
 * const program = new Program();
 * const module = program.upload({ kind: "module", source: "x = 1" });
 * if (!(module instanceof Register) || module.id !== "upload_0") throw new Error();
 * ```
 */
export class Register {
  /** The producing instruction's id. */
  readonly id: string;

  /** Wrap an instruction id (normally the builder does this). */
  constructor(id: string) {
    if (typeof id !== "string" || id === "") {
      throw new TypeError("a Register needs a non-empty string id");
    }
    this.id = id;
    Object.freeze(this);
  }

  /** The wire form, `{"$ref": id}`. */
  toRef(): { $ref: string } {
    return { $ref: this.id };
  }
}
