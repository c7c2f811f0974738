//! The running kernel's types, from its BTF (`/sys/kernel/btf/vmlinux`, mapped and read on demand:
//! a few milliseconds, where parsing it whole takes 0.13 s): where a field lies in a kernel
//! struct, for the kernel side's reads of kernel memory.

use btf_rs::{Btf, Type};

/// The running kernel's BTF.
pub struct KernelTypes(Btf);

impl KernelTypes {
    /// Opens the running kernel's BTF, or says why it cannot.
    pub fn open() -> Result<Self, String> {
        const PATH: &str = "/sys/kernel/btf/vmlinux";
        let mapped = Btf::from_file_with_backend(PATH, btf_rs::Backend::Mmap);
        mapped
            .or_else(|_| Btf::from_file(PATH))
            .map(Self)
            .map_err(|e| format!("kernel BTF ({PATH}): {e}"))
    }

    /// Byte offset of the field reached through `fields` (member names, each in the struct the
    /// one before is) in struct `name`. Members of anonymous structs and unions are found
    /// through them.
    pub fn offset(&self, name: &str, fields: &[&str]) -> Option<u64> {
        let structs = self.0.resolve_types_by_name(name).ok()?;
        let mut ty = structs.into_iter().find(|t| matches!(t, Type::Struct(_)))?;
        let mut offset = 0;
        for field in fields {
            let (at, next) = self.member(&ty, field)?;
            offset += at;
            ty = next;
        }
        Some(offset)
    }

    /// Byte offset and type (qualifiers and typedefs stripped) of member `name` of `ty`.
    fn member(&self, ty: &Type, name: &str) -> Option<(u64, Type)> {
        let (Type::Struct(s) | Type::Union(s)) = ty else {
            return None;
        };
        s.members.iter().find_map(|m| {
            let at = u64::from(m.bit_offset()) / 8;
            let member_name = self.0.resolve_name(m).unwrap_or_default();
            let ty = self.bare(self.0.resolve_chained_type(m).ok()?)?;
            if member_name == name {
                return Some((at, ty));
            }
            if !member_name.is_empty() {
                return None;
            }
            let (inner, found) = self.member(&ty, name)?;
            Some((at + inner, found))
        })
    }

    /// `ty` without its typedefs and qualifiers.
    fn bare(&self, mut ty: Type) -> Option<Type> {
        for _ in 0..16 {
            match &ty {
                Type::Typedef(_)
                | Type::Const(_)
                | Type::Volatile(_)
                | Type::Restrict(_)
                | Type::TypeTag(_) => {
                    ty = self.0.resolve_chained_type(ty.as_btf_type()?).ok()?;
                }
                _ => return Some(ty),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::KernelTypes;

    #[test]
    fn fields_are_found_in_the_running_kernels_structs_through_nested_and_anonymous_members() {
        let types = KernelTypes::open().unwrap();
        let fsbase = types.offset("task_struct", &["thread", "fsbase"]).unwrap();
        let thread = types.offset("task_struct", &["thread"]).unwrap();
        assert!(
            fsbase > thread && fsbase < thread + 4096,
            "{thread} {fsbase}"
        );
        // `inode.i_ino` follows `i_sb` and `i_mapping` in every kernel since 2.6.
        let (sb, ino) = (
            types.offset("inode", &["i_sb"]).unwrap(),
            types.offset("inode", &["i_ino"]).unwrap(),
        );
        assert!(ino > sb, "{sb} {ino}");
        assert_eq!(types.offset("inode", &["no_such_field"]), None);
        assert_eq!(types.offset("no_such_struct_here", &["x"]), None);
    }
}
