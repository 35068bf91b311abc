/**
 * Run by vitest before every test file (`setupFiles`), in the fork that runs it. The forks run
 * file after file in one process (`isolate: false`), so a harness module is loaded once per fork:
 * what it must undo after each file is registered here, not by the module itself.
 */
import { afterAll } from "vitest"
import { removeConfigHomes } from "./Cli.ts"

afterAll(removeConfigHomes)
