SUMMARY = "edged: the edgefleet device daemon as a systemd service"
DESCRIPTION = "Installs edged.service (Type=notify, watchdog), the first-boot enrollment unit, \
the default /etc/edged/edged.toml, the accelerator udev rules and the edged system user."
HOMEPAGE = "https://github.com/edgefleet/edgefleet"
SECTION = "base"
LICENSE = "Apache-2.0"
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/Apache-2.0;md5=89aea4e17d99a7cacdbeed46a0096b10"

SRC_URI = "git://github.com/edgefleet/edgefleet.git;protocol=https;branch=main"
SRCREV = "${AUTOREV}"

S = "${UNPACKDIR}/git"

inherit systemd useradd

USERADD_PACKAGES = "${PN}"
GROUPADD_PARAM:${PN} = "--system edged"
USERADD_PARAM:${PN} = "--system --gid edged --home-dir ${localstatedir}/lib/edged --no-create-home \
--shell /sbin/nologin edged"

SYSTEMD_PACKAGES = "${PN}"
SYSTEMD_SERVICE:${PN} = "edged.service edged-enroll.service"
SYSTEMD_AUTO_ENABLE:${PN} = "enable"

do_configure[noexec] = "1"
do_compile[noexec] = "1"

do_install() {
    install -d ${D}${systemd_system_unitdir} ${D}${sysconfdir}/edged ${D}${nonarch_base_libdir}/udev/rules.d \
        ${D}${nonarch_libdir}/tmpfiles.d
    # the units run /opt/edgefleet/bin/edged (the Debian package's venv); here it is in bindir
    for unit in edged.service edged-enroll.service; do
        sed -e 's,/opt/edgefleet/bin/,${bindir}/,g' ${S}/packaging/systemd/${unit} \
            > ${D}${systemd_system_unitdir}/${unit}
        chmod 0644 ${D}${systemd_system_unitdir}/${unit}
    done
    install -m 0644 ${S}/packaging/config/edged.toml ${D}${sysconfdir}/edged/edged.toml
    install -m 0644 ${S}/packaging/udev/70-edgefleet-accelerators.rules \
        ${D}${nonarch_base_libdir}/udev/rules.d/70-edgefleet-accelerators.rules
    # /run/systemd/dynamic-uid before edged.service's namespace is set up (packaging/tmpfiles)
    install -m 0644 ${S}/packaging/tmpfiles/edged.conf ${D}${nonarch_libdir}/tmpfiles.d/edged.conf
}

FILES:${PN} += "${systemd_system_unitdir} ${nonarch_base_libdir}/udev/rules.d ${nonarch_libdir}/tmpfiles.d"
CONFFILES:${PN} = "${sysconfdir}/edged/edged.toml"

RDEPENDS:${PN} = "python3-edgefleet"
