#!/usr/bin/env bash
# Opt-in set-up of the `desktop` environment backend (issue 14): the Debian packages a local
# desktop session runs (Xvfb, a window manager, xdotool, a terminal, a text editor, a file
# manager, LibreOffice Calc and Writer, an AT-SPI accessibility bus) and the Python libraries
# its evaluators and accessibility trees use. Not needed for the default tests; the desktop
# tests skip without it.
#
#     bash scripts/setup_desktop.sh          # idempotent: a second run checks and returns
#
# Environment: CSD_VENV (default .venv), the virtualenv that gets the Python libraries;
# CSD_DESKTOP_USER (default csd-desktop), the prefix of the users desktops run as when the
# server is root; CSD_DESKTOP_USERS (default 8), how many (one per live desktop).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${CSD_VENV:-.venv}

say() { printf '[setup-desktop] %s\n' "$*"; }

# Binary -> Debian package; only the missing ones are installed.
declare -A NEED=(
    [Xvfb]=xvfb
    [xdotool]=xdotool
    [wmctrl]=wmctrl
    [openbox]=openbox
    [xterm]=xterm
    [mousepad]=mousepad
    [pcmanfm]=pcmanfm
    [localc]=libreoffice-calc
    [lowriter]=libreoffice-writer
)
missing=()
for bin in "${!NEED[@]}"; do
    command -v "$bin" >/dev/null || missing+=("${NEED[$bin]}")
done
# Accessibility trees (DesktopConfig.atspi): a private AT-SPI bus and registry per desktop, the
# GTK bridge that exports the apps' widgets, and LibreOffice's GTK UI (its X11 one exports none).
for pkg in dbus-daemon at-spi2-core libatk-adaptor libreoffice-gtk3; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]} (once; a few minutes)"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq >/dev/null
    # No recommends: LibreOffice's recommends pull in Java and hundreds of MiB of fonts/help.
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" fonts-liberation2 x11-utils wmctrl >/dev/null
fi

# The unprivileged users a root server runs desktops' apps, terminals and setup commands as
# (DesktopConfig.desktop_user is their prefix): one per live desktop, so desktops cannot read
# or signal each other's; no password, no home of their own (each desktop gives one), bash as
# shell (the terminal starts the passwd shell), no groups besides their own.
DESKTOP_USER=${CSD_DESKTOP_USER:-csd-desktop}
DESKTOP_USERS=${CSD_DESKTOP_USERS:-8}
if [ "$(id -u)" -eq 0 ]; then
    made=()
    for ((k = 0; k < DESKTOP_USERS; k++)); do
        if ! id -u "$DESKTOP_USER-$k" >/dev/null 2>&1; then
            useradd --system --user-group --shell /bin/bash --home-dir /nonexistent \
                --no-create-home --comment "ComputerSD desktop $k" "$DESKTOP_USER-$k"
            made+=("$DESKTOP_USER-$k")
        fi
    done
    [ ${#made[@]} -eq 0 ] || say "created users ${made[0]} … ${made[-1]} (${#made[@]})"
fi

if [ -x "$VENV/bin/python" ]; then
    if ! "$VENV/bin/python" -c "import openpyxl, docx, jeepney" 2>/dev/null; then
        say "installing openpyxl, python-docx, jeepney into $VENV"
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
            openpyxl==3.1.5 python-docx==1.2.0 jeepney==0.9.0
    fi
else
    say "no virtualenv at $VENV yet: run scripts/setup.sh, then this script again"
    exit 1
fi
say "ready: Xvfb $(dpkg-query -W -f='${Version}' xvfb 2>/dev/null), $(soffice --version 2>/dev/null | cut -d' ' -f1-2)"
