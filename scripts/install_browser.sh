#!/bin/sh
# Debian's chromium and chromium-driver for the browser test of the HTML report
# (tests/test_html_report.py); `make test` runs this. A browser downloaded at run time (selenium-manager,
# playwright) does not work on the project's machines, the distribution's packages do.
# Idempotent: nothing happens when both are there. Where apt-get (or root) is missing, or the install
# fails, it says so and exits 0: the browser test is then skipped, the rest of the suite runs.
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_browser.sh: no apt-get here: install chromium and chromedriver yourself, or the browser test is skipped"
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        echo "install_browser.sh: not root (and no password-less sudo): run 'apt-get install chromium chromium-driver' as root, or the browser test is skipped"
        exit 0
    fi
fi
echo "install_browser.sh: apt-get install chromium chromium-driver (for the HTML report's browser test)"
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; }; then
    echo "install_browser.sh: the install failed: the browser test will be skipped"
fi
exit 0
