// Headless Chromium for the browser tests: Debian's chromium (or $CHROMIUM) through
// playwright-core, in a fresh profile that `close()` removes with the browser.
import { chromium } from "playwright-core";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

/** A persistent context of the given viewport, and a `close()` that also drops its profile. */
export async function launch(viewport) {
  const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), "ferrograph-chromium-"));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    viewport,
    args: [
      "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
    ],
  });
  const close = async () => {
    await context.close();
    fs.rmSync(userDataDir, { recursive: true, force: true });
  };
  return { context, close };
}
