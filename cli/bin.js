#!/usr/bin/env node
// The `hangar` command. The project runs TypeScript directly through tsx (no build step), so the
// bin registers tsx's loader and hands over to cli/main.ts.
import { register } from "tsx/esm/api"

register()
await import("./main.ts")
