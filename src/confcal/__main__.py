from confcal.cli import console

console()
